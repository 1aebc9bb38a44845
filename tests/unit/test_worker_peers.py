"""The broker passes on only what a registered connection sent (daemon/workers/peers.py):
a real Broker on an ipc socket, DEALERs as peers, a handler that accepts every
registration, as the core does for one with the key."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import zmq
import zmq.asyncio

from daemon.workers import broker as broker_module
from daemon.workers import protocol
from daemon.workers.broker import Broker
from daemon.workers.peers import DroppedFrames

STATS = protocol.WorkerStats(kv_capacity_tokens=1, kv_used_tokens=0, running=0, waiting=0)


def heartbeat(worker_id: str) -> bytes:
    return protocol.encode(protocol.Heartbeat(worker_id=worker_id, stats=STATS))


def register(worker_id: str) -> bytes:
    return protocol.encode(protocol.Register(
        worker_id=worker_id, engine="sim", model="m", kv_capacity_tokens=1, block_size=16,
        max_batch=1, schema_hash=protocol.SCHEMA_HASH))


class Peers:
    """A broker whose handler accepts registrations and keeps everything else it gets."""

    def __init__(self, tmp: Path) -> None:
        self.passed: list[tuple[bytes, protocol.WorkerMessage]] = []
        self._arrived = asyncio.Event()
        self.broker = Broker(f"ipc://{tmp / 'w.sock'}", self._on_message)
        self._ctx = zmq.asyncio.Context()

    def _on_message(self, identity: bytes, msg: protocol.WorkerMessage) -> None:
        if isinstance(msg, protocol.Register):
            self.broker.send(identity, protocol.RegisterAck(accepted=True))
        else:
            self.passed.append((identity, msg))
            self._arrived.set()

    def dealer(self, identity: bytes) -> zmq.asyncio.Socket:
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.IDENTITY, identity)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(self.broker.endpoint)
        return sock

    async def registered(self, identity: bytes) -> zmq.asyncio.Socket:
        sock = self.dealer(identity)
        await sock.send(register(identity.decode()))
        assert await answer(sock) == protocol.RegisterAck(accepted=True)
        return sock

    async def passed_from(self, identity: bytes, n: int) -> None:
        async with asyncio.timeout(5):
            while sum(i == identity for i, _ in self.passed) < n:
                self._arrived.clear()
                await self._arrived.wait()


async def answer(sock: zmq.asyncio.Socket) -> protocol.DaemonMessage:
    assert await sock.poll(5000), "no answer from the broker"
    return protocol.decode_from_daemon(await sock.recv())


@asynccontextmanager
async def peers(tmp: Path) -> AsyncIterator[Peers]:
    p = Peers(tmp)
    p.broker.start()
    try:
        yield p
    finally:
        await p.broker.stop()
        p._ctx.destroy(linger=0)


async def test_a_peer_claiming_a_connected_workers_id_gets_nothing_through(
        tmp_path: Path) -> None:
    async with peers(tmp_path) as p:
        worker = await p.registered(b"w-0")
        spoofer = p.dealer(b"w-0")
        for frame in (b"\xff junk", heartbeat("w-0"), register("w-0")):
            await spoofer.send(frame)
        for n in range(1, 4):  # the worker's own frames keep arriving
            await worker.send(heartbeat("w-0"))
            await p.passed_from(b"w-0", n)
        await asyncio.sleep(0.2)
        assert len(p.passed) == 3
        assert not await spoofer.poll(0), "the spoofer was answered"
        # Nothing reached the broker from the spoofer: not even a drop to count.
        assert p.broker.dropped.dropped == {}


async def test_a_connection_that_did_not_register_is_dropped_whatever_id_it_claims(
        tmp_path: Path) -> None:
    async with peers(tmp_path) as p:
        worker = await p.registered(b"w-0")
        await worker.send(heartbeat("w-0"))
        await p.passed_from(b"w-0", 1)
        worker.close()
        await asyncio.sleep(0.2)  # the worker is away; its id is free to claim
        spoofer = p.dealer(b"w-0")
        await spoofer.send(heartbeat("w-0"))
        reply = await answer(spoofer)
        assert reply == protocol.RegisterAck(accepted=False,
                                             message="unknown worker: register again")
        stranger = p.dealer(b"nobody")
        await stranger.send(heartbeat("nobody"))
        await stranger.send(b"\x00 not msgpack")
        await answer(stranger)
        await asyncio.sleep(0.1)
        assert len(p.passed) == 1  # only the worker's own heartbeat
        assert p.broker.dropped.dropped == {"unregistered": 2, "malformed": 1}
        # A registration (with the key, which the core checks) makes the id its own.
        await spoofer.send(register("w-0"))
        assert (await answer(spoofer)).accepted  # type: ignore[union-attr]
        await spoofer.send(heartbeat("w-0"))
        await p.passed_from(b"w-0", 2)


FROZEN_WORKER = """
import sys, time, zmq
from daemon.workers import protocol
sock = zmq.Context().socket(zmq.DEALER)
sock.setsockopt(zmq.IDENTITY, b"w-0")
sock.connect(sys.argv[1])
sock.send(protocol.encode(protocol.Register(
    worker_id="w-0", engine="sim", model="m", kv_capacity_tokens=1, block_size=16,
    max_batch=1, schema_hash=protocol.SCHEMA_HASH)))
sock.recv()
print("registered", flush=True)
time.sleep(120)
"""


async def test_the_id_of_a_connection_that_went_dead_is_freed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without handover a new connection cannot take a connected id, so a worker whose
    old connection hangs (its host lost power: no FIN ever arrives) must not be locked out:
    ZeroMQ's pings close a connection that stops answering them."""
    monkeypatch.setattr(broker_module, "PEER_PING_S", 0.2)
    monkeypatch.setattr(broker_module, "PEER_TIMEOUT_S", 1.0)
    async with peers(tmp_path) as p:
        frozen = await asyncio.create_subprocess_exec(
            sys.executable, "-c", FROZEN_WORKER, p.broker.endpoint,
            stdout=asyncio.subprocess.PIPE)
        try:
            assert frozen.stdout is not None
            assert await frozen.stdout.readline() == b"registered\n"
            os.kill(frozen.pid, signal.SIGSTOP)  # its socket stays open, and silent
            await asyncio.sleep(2.0)
            await p.registered(b"w-0")
        finally:
            frozen.kill()
            await frozen.wait()


def test_dropped_frames_are_all_counted_and_logged_once_a_minute(
        caplog: pytest.LogCaptureFixture) -> None:
    drops = DroppedFrames()
    with caplog.at_level(logging.WARNING, logger="agentd.worker_peers"):
        logged = [drops.record("malformed", b"x", "junk", now=t * 0.1) for t in range(1400)]
        logged += [drops.record("unregistered", b"x", "Heartbeat", now=10.0),
                   drops.record("malformed", b"x", "junk", now=200.0)]
    assert drops.dropped == {"malformed": 1401, "unregistered": 1}
    assert sum(logged) == 5  # at 0, 60 and 120 s, the other reason's first, at 200 s
    assert len(caplog.records) == 5
