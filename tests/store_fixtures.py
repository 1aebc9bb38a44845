"""A real store for tests, on each database agentd supports: an SQLite file in a temp dir,
and a fresh database on a throwaway PostgreSQL server (tests/postgres.py), with the
daemon's batched writer running on it.

`store_url` is parametrized over both, so every test that takes it (or
`store_with_writer`) runs once per database; `postgres_url` is PostgreSQL only."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from db.engine import make_engine, make_sessionmaker, sqlite_url, upgrade
from db.writer import BatchWriter
from tests.postgres import PostgresServer, start_server

Store = tuple[BatchWriter, async_sessionmaker[AsyncSession]]

DATABASES = ("sqlite", "postgresql")


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """One server for the whole session (started on first use), stopped at its end."""
    server = start_server()
    yield server
    server.stop()


@pytest.fixture
def postgres_url(postgres_server: PostgresServer) -> Iterator[str]:
    """A fresh empty database on the session's server (asyncpg URL), dropped afterwards."""
    name = postgres_server.create_database()
    yield postgres_server.url(name)
    postgres_server.drop_database(name)


@contextlib.contextmanager
def module_db(request: pytest.FixtureRequest) -> Iterator[str]:
    """For a module-scoped daemon fixture parametrized over DATABASES: the daemon's `--db`,
    "" (its SQLite file) or a PostgreSQL database of its own, dropped afterwards."""
    if request.param == "sqlite":
        yield ""
        return
    server: PostgresServer = request.getfixturevalue("postgres_server")
    name = server.create_database()
    try:
        yield server.url(name)
    finally:
        server.drop_database(name)


@pytest.fixture(params=DATABASES)
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """An empty store's URL: an SQLite file, or a fresh PostgreSQL database."""
    if request.param == "sqlite":
        return sqlite_url(tmp_path / "agentd.db")
    return str(request.getfixturevalue("postgres_url"))


@pytest.fixture
async def store_with_writer(store_url: str) -> AsyncIterator[Store]:
    await upgrade(store_url)
    engine = make_engine(store_url)
    writer = BatchWriter(engine)
    writer.start()
    yield writer, make_sessionmaker(engine)
    await writer.stop()
    await engine.dispose()


@pytest.fixture(params=DATABASES)
def daemon_db(request: pytest.FixtureRequest) -> str:
    """A daemon's `--db`: "" (its SQLite file in the data dir) or a fresh PostgreSQL
    database; give it to `DaemonProcess(db=...)`."""
    if request.param == "sqlite":
        return ""
    return str(request.getfixturevalue("postgres_url"))
