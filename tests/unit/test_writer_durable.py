"""BatchWriter.durable: commits at once when someone waits, one commit for many waiters,
and refuses to call a write durable when a batch failed after the caller's mark."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from sqlalchemy import event, func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from db import models
from db.engine import make_engine, make_sessionmaker, upgrade
from db.writer import BatchWriter, NotDurable

NEVER_ON_ITS_OWN = 3600.0  # the writer's interval: only a waiter makes it commit


@pytest.fixture
async def engine(store_url: str) -> AsyncIterator[AsyncEngine]:
    url = store_url
    await upgrade(url)
    engine = make_engine(url)
    yield engine
    await engine.dispose()


@pytest.fixture
async def writer(engine: AsyncEngine) -> AsyncIterator[BatchWriter]:
    writer = BatchWriter(engine, interval_s=NEVER_ON_ITS_OWN)
    writer.start()
    yield writer
    await writer.stop()


def _session(sid: str) -> dict[str, Any]:
    return {"id": sid, "tenant": "default", "priority": 0, "slo_class": "default",
            "pinned_worker": None, "state": {}, "created_at": 1.0, "updated_at": 1.0}


async def test_waiters_share_one_prompt_commit(engine: AsyncEngine, writer: BatchWriter) -> None:
    commits: list[int] = []
    event.listen(engine.sync_engine, "commit", lambda _conn: commits.append(1))

    async def finish(n: int) -> None:
        since = writer.mark()
        writer.insert("sessions", _session(f"s{n}"))
        await writer.durable(since)

    async with asyncio.timeout(10):  # far less than the writer's own interval
        await asyncio.gather(*(finish(n) for n in range(100)))
    async with make_sessionmaker(engine)() as s:
        assert await s.scalar(select(func.count()).select_from(models.Session)) == 100
    assert 1 <= len(commits) <= 2, commits


async def test_a_failed_batch_after_the_mark_is_not_durable(writer: BatchWriter) -> None:
    writer.insert("sessions", _session("s"))
    await writer.flush()
    since = writer.mark()
    writer.insert("sessions", _session("s"))  # the same key again: the batch fails
    with pytest.raises(NotDurable, match="IntegrityError"):
        await writer.durable(since)
    # A later mark is not blamed for that batch.
    since = writer.mark()
    writer.insert("sessions", _session("t"))
    await writer.durable(since)


async def test_a_stopped_writer_promises_nothing(engine: AsyncEngine) -> None:
    writer = BatchWriter(engine)
    writer.start()
    await writer.stop()
    since = writer.mark()
    writer.insert("sessions", _session("s"))
    async with asyncio.timeout(5):  # refused, not waited on for ever
        with pytest.raises(NotDurable, match="not running"):
            await writer.durable(since)
