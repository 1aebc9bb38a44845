"""Lineage inference on a real core: which program a request that names none joins
(daemon/core/lineage.py). A DEALER socket registers as a worker and answers the core's submits,
so each reply is exactly the text the test chooses."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import zmq
import zmq.asyncio

from daemon.config import Config
from daemon.core import lineage
from daemon.core.core import Core
from daemon.core.lineage import Lineage, prefix_digests
from daemon.core.tenants import open_program
from daemon.state import ProgramState, ProgramStatus, RequestState
from daemon.workers import protocol
from daemon.workers.protocol import ChatMessage, ToolCall
from tests.store_fixtures import Store
from tests.waiting import wait_for_async

WORKER = "w-lineage"
TASK = [ChatMessage(role="system", content="agent"), ChatMessage(role="user", content="fix it")]
SAMPLING = protocol.SamplingParams(max_tokens=4)


@pytest.fixture
async def core(tmp_path: Path, store_with_writer: Store) -> AsyncIterator[Core]:
    writer, sessions = store_with_writer
    config = Config(data_dir=str(tmp_path), config_dir=str(tmp_path / "config"),
                    heartbeat_timeout_s=600.0, lineage_idle_s=30.0)
    core = Core(config, writer, sessions)
    await core.start()
    yield core
    await core.stop()


@pytest.fixture
async def worker(core: Core) -> AsyncIterator[zmq.asyncio.Socket]:
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


async def ask(core: Core, messages: list[ChatMessage], tenant: str = "t"
              ) -> tuple[ProgramState, RequestState]:
    """What the gateway does for a chat request without a program_id."""
    program = await open_program(core, None, None, tenant, messages)
    return program, core.submit(program, "chat", "m", SAMPLING, messages=messages)


async def answer(sock: zmq.asyncio.Socket, req: RequestState, text: str) -> None:
    """The worker runs the request to its end with `text` as the reply."""
    sent = protocol.decode_from_daemon(await asyncio.wait_for(sock.recv(), 10))
    assert isinstance(sent, protocol.Submit) and sent.request_id == req.id, sent
    await sock.send(protocol.encode(protocol.TokenDelta(
        request_id=req.id, text=text, num_tokens=2, prompt_tokens=10, cached_tokens=0)))
    await sock.send(protocol.encode(protocol.Finish(
        request_id=req.id, reason="stop", prompt_tokens=10, cached_tokens=0, output_tokens=2)))
    item = await asyncio.wait_for(req.stream.get(), 10)
    while item.finish is None:
        item = await asyncio.wait_for(req.stream.get(), 10)


def then(messages: list[ChatMessage], reply: str, tool: str) -> list[ChatMessage]:
    return [*messages, ChatMessage(role="assistant", content=reply),
            ChatMessage(role="tool", content=tool)]


def test_a_digest_covers_role_and_content_but_not_surrounding_space() -> None:
    base = prefix_digests([ChatMessage(role="user", content="run the tests")])[-1]
    assert prefix_digests([ChatMessage(role="user", content=" run the tests\n")])[-1] == base
    assert prefix_digests([ChatMessage(role="system", content="run the tests")])[-1] != base
    assert prefix_digests([ChatMessage(role="user", content="run the test")])[-1] != base


def test_a_call_is_its_name_and_arguments_not_their_spelling_or_id() -> None:
    def turn(name: str, arguments: str, call_id: str = "call-1") -> bytes:
        call = ToolCall(id=call_id, name=name, arguments=arguments)
        return prefix_digests([ChatMessage(role="assistant", content="", tool_calls=[call])])[-1]

    base = turn("shell", '{"command": "ls", "cwd": "/"}')
    assert turn("shell", '{"cwd":"/","command":"ls"}', "call-other") == base
    assert turn("shell", '{"command": "ls -la", "cwd": "/"}') != base
    assert turn("python", '{"command": "ls", "cwd": "/"}') != base
    assert turn("shell", "not json") == turn("shell", "not json")


async def test_a_continuation_joins_and_a_copy_of_a_busy_one_does_not(
        core: Core, worker: zmq.asyncio.Socket) -> None:
    first, req = await ask(core, TASK)
    await answer(worker, req, "ls -la")
    continued = then(TASK, "ls -la", "README.md")
    joined, running = await ask(core, continued)
    assert joined is first
    # The same history again while the program runs: a copy of the conversation (a retry
    # racing the original, or two identical agents), not the program's next step.
    copy, _ = await ask(core, continued)
    assert copy is not first
    assert running.program_id == first.id


async def test_only_the_latest_reply_is_remembered_and_the_cache_is_bounded(
        core: Core, worker: zmq.asyncio.Socket) -> None:
    core.lineage = Lineage(core, remember=1)
    one, req = await ask(core, TASK)
    await answer(worker, req, "step one")
    _, req = await ask(core, [ChatMessage(role="user", content="another agent")])
    await answer(worker, req, "step two")
    # One reply fits: the older program's was dropped, so its continuation starts afresh.
    assert (await ask(core, then(TASK, "step one", "out")))[0] is not one
    assert one.status == ProgramStatus.ACTING  # it did not end: it was forgotten


async def test_a_quiet_program_gives_up_its_room_and_can_still_be_joined(
        core: Core, worker: zmq.asyncio.Socket) -> None:
    program, req = await ask(core, TASK)
    await answer(worker, req, "make test")
    # A tuple, not two comparisons: mypy would narrow the status to ACTING for good.
    assert (program.status, program.worker_id) == (ProgramStatus.ACTING, WORKER)
    await wait_for_async(lambda: program.status == ProgramStatus.PAUSED, 10,
                         f"the quiet program to be paused ({lineage.QUIET_FLOOR_S} s)")
    joined, _ = await ask(core, then(TASK, "make test", "2 failed"))
    assert joined is program


async def test_an_idle_program_ends_and_takes_its_reply_with_it(
        core: Core, worker: zmq.asyncio.Socket) -> None:
    core.lineage.idle_s = 0.5
    program, req = await ask(core, TASK)
    await answer(worker, req, "echo hi")
    assert (core.lineage.holds(program.id), program.status) == (True, ProgramStatus.ACTING)
    await wait_for_async(lambda: program.status == ProgramStatus.STOPPED, 10,
                         "the idle program to end")
    assert not core.lineage.holds(program.id)
    assert (await ask(core, then(TASK, "echo hi", "hi")))[0] is not program


async def test_a_failed_first_request_leaves_nothing_to_join(core: Core) -> None:
    program, req = await ask(core, TASK)
    await core.abort(req.id)
    assert not core.lineage.holds(program.id)  # the gateway releases it as before
