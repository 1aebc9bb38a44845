"""Engine and session factory; applies migrations before the daemon serves."""

from __future__ import annotations

import asyncio
import logging
import os
import stat
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config as AlembicConfig
from sqlalchemy import event
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker, create_async_engine

MIGRATIONS_DIR = Path(__file__).parent / "migrations"
# SQLite's own files beside the database; SQLite creates them with the database's mode.
SQLITE_SIDE_FILES = ("-wal", "-shm", "-journal")

log = logging.getLogger("agentd.store")


def sqlite_url(path: Path) -> str:
    return f"sqlite+aiosqlite:///{path}"


def sqlite_file(url: str) -> Path | None:
    """The database file of an SQLite URL; None for other databases and in-memory ones."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return None
    return Path(parsed.database)


def make_private(url: str) -> None:
    """Make an SQLite store readable by its owner only (0600) before anything is written:
    create the file, which SQLite would create by the umask (0644 by default), and take
    other users' access from a file left open by an older version, and from its side
    files. Other databases guard themselves."""
    path = sqlite_file(url)
    if path is None:
        return
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600))
    except FileNotFoundError:
        return  # no such directory: SQLite says so when the store is opened
    for file in (path, *(Path(f"{path}{side}") for side in SQLITE_SIDE_FILES)):
        try:
            mode = stat.S_IMODE(file.stat().st_mode)
            if mode & 0o077:
                file.chmod(mode & 0o700)
        except FileNotFoundError:
            pass
        except OSError as exc:
            log.warning("cannot make %s readable by its owner only: %s", file, exc)


def sync_url(url: str) -> str:
    """The same database with the sync driver (Alembic runs synchronously in a thread)."""
    return url.replace("+aiosqlite", "").replace("+asyncpg", "+psycopg")


def make_engine(url: str, application_name: str = "") -> AsyncEngine:
    """`application_name`: what PostgreSQL shows for its connections (a daemon names its
    own, so that a standby taking over can fence them off: db/lease.py)."""
    kwargs: dict[str, Any] = {}
    if url.startswith("sqlite"):
        kwargs["connect_args"] = {"timeout": 30}
    elif application_name and url.startswith("postgresql+asyncpg"):
        kwargs["connect_args"] = {"server_settings": {"application_name": application_name}}
    engine = create_async_engine(url, **kwargs)
    if url.startswith("sqlite"):
        event.listen(engine.sync_engine, "connect", _sqlite_pragmas)
    return engine


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    cur = dbapi_conn.cursor()
    # WAL lets readers (REST, consoles) proceed while the batched writer commits;
    # NORMAL sync is durable across process crashes, which is what we promise.
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.close()


def make_sessionmaker(engine: AsyncEngine) -> async_sessionmaker[Any]:
    return async_sessionmaker(engine, expire_on_commit=False)


def alembic_config(url: str) -> AlembicConfig:
    cfg = AlembicConfig()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.set_main_option("sqlalchemy.url", sync_url(url))
    return cfg


def upgrade_sync(url: str) -> None:
    command.upgrade(alembic_config(url), "head")


async def upgrade(url: str) -> None:
    await asyncio.to_thread(upgrade_sync, url)
