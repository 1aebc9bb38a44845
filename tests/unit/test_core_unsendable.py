"""A request whose worker message cannot be encoded fails alone.

The gateway bounds every integer it forwards (tests/integration/test_boundary_validation.py),
so no HTTP request reaches this; the core must hold anyway: such a request once raised
out of the dispatch after it was marked as sent, leaving its program QUEUED and the
worker waiting on a request it never got, until the stall detector marked it suspect.
A real core and broker, and a DEALER registering as a worker does.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import zmq
import zmq.asyncio

from daemon.config import Config
from daemon.core.core import Core
from daemon.state import ProgramStatus, RequestState, RequestStatus
from daemon.workers import protocol
from tests.store_fixtures import Store

WORKER = "w-encode"
HELLO = [protocol.ChatMessage(role="user", content="hi")]


@pytest.fixture
async def core(tmp_path: Path, store_with_writer: Store) -> AsyncIterator[Core]:
    writer, sessions = store_with_writer
    # A heartbeat timeout the test cannot run into: the worker's health is what is watched.
    config = Config(data_dir=str(tmp_path), config_dir=str(tmp_path / "config"),
                    heartbeat_timeout_s=600.0)
    core = Core(config, writer, sessions)
    await core.start()
    yield core
    await core.stop()


@pytest.fixture
async def worker(core: Core) -> AsyncIterator[zmq.asyncio.Socket]:
    """A worker socket the core has registered (it answered the registration)."""
    sock = zmq.asyncio.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.IDENTITY, WORKER.encode())
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(core.broker.endpoint)
    await sock.send(protocol.encode(protocol.Register(
        worker_id=WORKER, engine="sim", model="m", kv_capacity_tokens=8192, block_size=16,
        max_batch=8, schema_hash=protocol.SCHEMA_HASH, key=core.worker_key)))
    ack = protocol.decode_from_daemon(await asyncio.wait_for(sock.recv(), 10))
    assert isinstance(ack, protocol.RegisterAck) and ack.accepted, ack
    yield sock
    sock.close()


async def submit(core: Core, program_id: str, sampling: protocol.SamplingParams
                 ) -> RequestState:
    program = await core.ensure_program(program_id, None)
    return core.submit(program, "chat", "m", sampling, messages=HELLO)


async def test_an_unencodable_request_fails_alone(core: Core,
                                                  worker: zmq.asyncio.Socket) -> None:
    bad = await submit(core, "p-bad", protocol.SamplingParams(seed=2**64))
    item = bad.stream.get_nowait()
    assert item.error is not None and "cannot be sent" in item.error, item
    assert bad.status == RequestStatus.FAILED
    assert core.programs["p-bad"].status == ProgramStatus.ACTING  # not QUEUED for ever
    state = core.workers[WORKER]
    assert state.status == "healthy" and not state.inflight
    assert core.watch.stalled(time.time() + 3600) == {}  # nothing for the stall detector

    good = await submit(core, "p-good", protocol.SamplingParams(seed=2**63 - 1))
    sent = protocol.decode_from_daemon(await asyncio.wait_for(worker.recv(), 10))
    assert isinstance(sent, protocol.Submit) and sent.request_id == good.id
    assert good.status == RequestStatus.RUNNING and state.inflight == {good.id}
    assert state.status == "healthy"
