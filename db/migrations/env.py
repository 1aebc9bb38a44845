"""Alembic environment: migrations run with the sync driver in a thread at daemon start."""

from __future__ import annotations

from alembic import context
from sqlalchemy import engine_from_config, pool, text

from db.models import Base

# the advisory lock key migrations hold on PostgreSQL (any constant only agentd uses)
MIGRATION_LOCK = 0x61676E7464_01  # "agntd" 1

config = context.config
target_metadata = Base.metadata


def run_migrations_offline() -> None:
    context.configure(
        url=config.get_main_option("sqlalchemy.url"),
        target_metadata=target_metadata,
        literal_binds=True,
        render_as_batch=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connectable = engine_from_config(
        config.get_section(config.config_ini_section, {}),
        prefix="sqlalchemy.",
        poolclass=pool.NullPool,
    )
    with connectable.connect() as connection:
        context.configure(
            connection=connection, target_metadata=target_metadata, render_as_batch=True
        )
        with context.begin_transaction():
            if connection.dialect.name == "postgresql":
                # Two daemons on one database (an active one and a standby) upgrade at the
                # same start: the second waits here, then finds the schema at head. The
                # lock ends with the migration's transaction.
                connection.execute(text("SELECT pg_advisory_xact_lock(:key)"),
                                   {"key": MIGRATION_LOCK})
            context.run_migrations()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
