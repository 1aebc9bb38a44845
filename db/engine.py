"""Engine and session factory; applies migrations before the daemon serves."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config as AlembicConfig
from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker, create_async_engine

MIGRATIONS_DIR = Path(__file__).parent / "migrations"


def sqlite_url(path: Path) -> str:
    return f"sqlite+aiosqlite:///{path}"


def _sync_url(url: str) -> str:
    # Alembic runs synchronously in a worker thread; give it the sync driver.
    return url.replace("+aiosqlite", "").replace("+asyncpg", "+psycopg")


def make_engine(url: str) -> AsyncEngine:
    kwargs: dict[str, Any] = {}
    if url.startswith("sqlite"):
        kwargs["connect_args"] = {"timeout": 30}
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
    cfg.set_main_option("sqlalchemy.url", _sync_url(url))
    return cfg


def upgrade_sync(url: str) -> None:
    command.upgrade(alembic_config(url), "head")


async def upgrade(url: str) -> None:
    await asyncio.to_thread(upgrade_sync, url)
