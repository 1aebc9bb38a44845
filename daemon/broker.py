"""The engine broker: a ZeroMQ ROUTER that workers' DEALERs connect to.

It owns the socket and nothing else: frames are decoded here and handed to
the core as protocol structs; the core decides. A malformed frame is logged
and dropped, never allowed to take the receive loop down.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path

import zmq
import zmq.asyncio

from daemon import protocol

log = logging.getLogger("agentd.broker")

Handler = Callable[[bytes, protocol.WorkerMessage], Awaitable[None] | None]


class Broker:
    def __init__(self, endpoint: str, on_message: Handler) -> None:
        self.endpoint = endpoint
        self._on_message = on_message
        self._ctx = zmq.asyncio.Context()
        self._sock: zmq.asyncio.Socket | None = None
        self._task: asyncio.Task[None] | None = None
        self.malformed_frames = 0

    def start(self) -> None:
        if self.endpoint.startswith("ipc://"):
            path = Path(self.endpoint.removeprefix("ipc://"))
            path.parent.mkdir(parents=True, exist_ok=True)
            path.unlink(missing_ok=True)  # a stale socket file from a crashed daemon
        sock = self._ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        # A restarted worker reconnects with the same identity: let it take over.
        sock.setsockopt(zmq.ROUTER_HANDOVER, 1)
        sock.bind(self.endpoint)
        if self.endpoint.endswith(":0"):
            self.endpoint = sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self._sock = sock
        self._task = asyncio.create_task(self._recv_loop(), name="broker-recv")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self._sock is not None:
            self._sock.close(linger=0)
        self._ctx.term()

    def send(self, identity: bytes, message: protocol.DaemonMessage) -> None:
        assert self._sock is not None
        try:
            self._sock.send_multipart([identity, protocol.encode(message)], flags=zmq.NOBLOCK)
        except zmq.Again:
            log.warning("worker %s is not keeping up; dropped %s", identity, type(message).__name__)

    async def _recv_loop(self) -> None:
        assert self._sock is not None
        while True:
            frames = await self._sock.recv_multipart()
            if len(frames) != 2:
                self.malformed_frames += 1
                log.warning("dropping a message with %d frames", len(frames))
                continue
            identity, frame = frames
            try:
                message = protocol.decode_from_worker(frame)
            except protocol.ProtocolError as exc:
                self.malformed_frames += 1
                log.warning("dropping malformed frame from %r: %s", identity, exc)
                continue
            try:
                result = self._on_message(identity, message)
                if result is not None:
                    await result
            except Exception:
                log.exception("handling %s from %r failed", type(message).__name__, identity)
