"""A real SQLite store in a temp dir, with the daemon's batched writer running on it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from db.engine import make_engine, make_sessionmaker, sqlite_url, upgrade
from db.writer import BatchWriter

Store = tuple[BatchWriter, async_sessionmaker[AsyncSession]]


@pytest.fixture
async def store_with_writer(tmp_path: Path) -> AsyncIterator[Store]:
    url = sqlite_url(tmp_path / "agentd.db")
    await upgrade(url)
    engine = make_engine(url)
    writer = BatchWriter(engine)
    writer.start()
    yield writer, make_sessionmaker(engine)
    await writer.stop()
    await engine.dispose()
