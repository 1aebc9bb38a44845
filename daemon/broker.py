"""The engine broker: a ZeroMQ ROUTER that workers' DEALERs connect to.

It owns the socket and nothing else: frames are decoded here and handed to
the core as protocol structs; the core decides. A malformed frame is logged
and dropped, never allowed to take the receive loop down. Given the worker key
(`use_worker_key`, before `start`), a network endpoint is a CurveZMQ server
(daemon/worker_curve.py) and a monitor counts peers that fail the handshake.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path

import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from daemon import protocol, worker_curve
from daemon.metrics import add_collector

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
        self._worker_key = ""
        self._encrypt_ipc = False
        self.handshakes = worker_curve.HandshakeTally()
        self._monitor: zmq.asyncio.Socket | None = None
        self._monitor_task: asyncio.Task[None] | None = None
        self._remove_metrics: Callable[[], None] = lambda: None

    @property
    def encrypted(self) -> bool:
        return bool(self._worker_key) and (self._encrypt_ipc
                                           or worker_curve.encrypts(self.endpoint))

    def use_worker_key(self, key: str, *, encrypt_ipc: bool = False) -> None:
        """Encrypt a network endpoint with keys derived from `key`; call before start().
        `encrypt_ipc`: an ipc endpoint too (bench/worker_curve.py measures that cost)."""
        assert self._sock is None, "the socket is already bound"
        self._worker_key = key
        self._encrypt_ipc = encrypt_ipc

    def start(self) -> None:
        if self.endpoint.startswith("ipc://"):
            path = Path(self.endpoint.removeprefix("ipc://"))
            path.parent.mkdir(parents=True, exist_ok=True)
            path.unlink(missing_ok=True)  # a stale socket file from a crashed daemon
        sock = self._ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        # A restarted worker reconnects with the same identity: let it take over.
        sock.setsockopt(zmq.ROUTER_HANDOVER, 1)
        if self.encrypted:
            worker_curve.make_server(sock, self._worker_key)
            self._watch_handshakes(sock)
        elif worker_curve.encrypts(self.endpoint):
            log.warning("the worker socket %s is not encrypted (no worker key given)",
                        self.endpoint)
        sock.bind(self.endpoint)
        if self.endpoint.endswith(":0"):
            self.endpoint = sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self._sock = sock
        self._task = asyncio.create_task(self._recv_loop(), name="broker-recv")

    def _watch_handshakes(self, sock: zmq.asyncio.Socket) -> None:
        # Set up before bind, so even the first connection's failure is seen.
        self._monitor = sock.get_monitor_socket(worker_curve.HANDSHAKE_FAILED_EVENTS)
        self._monitor_task = asyncio.create_task(self._monitor_loop(), name="broker-monitor")
        self._remove_metrics = add_collector(self.handshakes.families)

    async def _monitor_loop(self) -> None:
        assert self._monitor is not None
        while True:
            event = parse_monitor_message(await self._monitor.recv_multipart())
            reason = worker_curve.failure_reason(event["event"], event["value"])
            if reason is not None:
                self.handshakes.record(reason, self.endpoint)

    async def stop(self) -> None:
        for task in (self._task, self._monitor_task):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        self._remove_metrics()
        if self._monitor is not None and self._sock is not None:
            self._sock.disable_monitor()
            self._monitor.close(linger=0)
        if self._sock is not None:
            self._sock.close(linger=0)
        self._ctx.term()

    def send(self, identity: bytes, message: protocol.DaemonMessage) -> None:
        """Raises protocol.EncodeError for a message the wire cannot carry."""
        self.send_frame(identity, protocol.encode(message), type(message).__name__)

    def send_frame(self, identity: bytes, frame: bytes, what: str) -> None:
        """Send a message encoded already: a caller that must change no state for a
        message that cannot be encoded encodes it first (Core._dispatch)."""
        assert self._sock is not None
        try:
            self._sock.send_multipart([identity, frame], flags=zmq.NOBLOCK)
        except zmq.Again:
            log.warning("worker %s is not keeping up; dropped %s", identity, what)

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
