"""The engine broker: a ZeroMQ ROUTER that workers' DEALERs connect to.

It owns the socket and nothing else: frames are decoded here and handed to
the core as protocol structs; the core decides. A malformed frame is counted
and dropped, never allowed to take the receive loop down. The broker also knows
which connection registered as which worker (daemon/workers/peers.py): only a
Register, or a frame from the connection that registered as its routing id,
reaches the core. Given the worker key (`use_worker_key`, before `start`), a
network endpoint is a CurveZMQ server (daemon/workers/curve.py) and a monitor
counts peers that fail the handshake.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Protocol

import zmq
import zmq.asyncio
from prometheus_client.metrics_core import Metric
from zmq.utils.monitor import parse_monitor_message

from daemon.workers import curve as worker_curve
from daemon.workers import protocol
from daemon.workers.peers import (
    ConnectionNamer,
    DroppedFrames,
    Registrations,
    connection_of,
    name_connections,
)

log = logging.getLogger("agentd.broker")

Handler = Callable[[bytes, protocol.WorkerMessage], Awaitable[None] | None]

REGISTER_AGAIN = protocol.REGISTER_AGAIN
READ_AT_ONCE = 256  # frames read without yielding to the event loop
PEER_PING_S = 2.0
PEER_TIMEOUT_S = 10.0  # answered by the peer's ZeroMQ I/O thread, not its event loop


class WorkerLink(Protocol):
    """How the core reaches its workers: the Broker over ZeroMQ, or the replay's sim
    workers in process (daemon/replay/workers.py). Messages back go to the handler the
    link was made with (`Core.on_worker_message`)."""

    endpoint: str

    def use_worker_key(self, key: str, *, encrypt_ipc: bool = False) -> None: ...

    def start(self) -> None: ...

    async def stop(self) -> None: ...

    def send(self, identity: bytes, message: protocol.DaemonMessage) -> None: ...

    def send_frame(self, identity: bytes, frame: bytes, what: str) -> None: ...


class Broker:
    def __init__(self, endpoint: str, on_message: Handler) -> None:
        self.endpoint = endpoint
        self._on_message = on_message
        self._ctx = zmq.asyncio.Context()
        self._sock: zmq.asyncio.Socket | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._namer: ConnectionNamer | None = None
        self.registrations = Registrations()
        self.dropped = DroppedFrames()
        # The Register being handled: (routing id, connection), bound if it is accepted.
        self._registering: tuple[bytes, str] | None = None
        self._worker_key = ""
        self._encrypt_ipc = False
        self.handshakes = worker_curve.HandshakeTally()
        self._monitor: zmq.asyncio.Socket | None = None

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
        self._namer = ConnectionNamer(self._ctx)
        self._tasks.append(asyncio.create_task(self._namer.run(), name="broker-zap"))
        sock = self._ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        # No ROUTER_HANDOVER: a peer claiming a connected worker's routing id is refused
        # instead of cutting that worker off (daemon/workers/peers.py). A connection that
        # stops answering ZeroMQ's pings (its host lost power, say) is closed instead,
        # which frees its id for the worker's next connection.
        name_connections(sock)
        sock.setsockopt(zmq.HEARTBEAT_IVL, int(PEER_PING_S * 1000))
        sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, int(PEER_TIMEOUT_S * 1000))
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
        self._tasks.append(asyncio.create_task(self._recv_loop(), name="broker-recv"))

    def _watch_handshakes(self, sock: zmq.asyncio.Socket) -> None:
        # Set up before bind, so even the first connection's failure is seen.
        self._monitor = sock.get_monitor_socket(worker_curve.HANDSHAKE_FAILED_EVENTS)
        self._tasks.append(asyncio.create_task(self._monitor_loop(), name="broker-monitor"))

    def families(self) -> Iterator[Metric]:
        """What the socket dropped, and failed handshakes when it is encrypted (for the
        daemon's registry, daemon/metrics.py)."""
        yield from self.dropped.families()
        if self._monitor is not None:
            yield from self.handshakes.families()

    async def _monitor_loop(self) -> None:
        assert self._monitor is not None
        while True:
            event = parse_monitor_message(await self._monitor.recv_multipart())
            reason = worker_curve.failure_reason(event["event"], event["value"])
            if reason is not None:
                self.handshakes.record(reason, self.endpoint)

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._monitor is not None and self._sock is not None:
            self._sock.disable_monitor()
            self._monitor.close(linger=0)
        if self._sock is not None:
            self._sock.close(linger=0)
        if self._namer is not None:
            self._namer.close()
        self._ctx.term()

    def send(self, identity: bytes, message: protocol.DaemonMessage) -> None:
        """Raises protocol.EncodeError for a message the wire cannot carry."""
        if isinstance(message, protocol.RegisterAck) and message.accepted:
            self._bind_registering(identity)
        self.send_frame(identity, protocol.encode(message), type(message).__name__)

    def send_frame(self, identity: bytes, frame: bytes, what: str) -> None:
        """Send a message encoded already: a caller that must change no state for a
        message that cannot be encoded encodes it first (Core._dispatch)."""
        assert self._sock is not None
        try:
            self._sock.send_multipart([identity, frame], flags=zmq.NOBLOCK)
        except zmq.Again:
            log.warning("worker %s is not keeping up; dropped %s", identity, what)

    def _bind_registering(self, identity: bytes) -> None:
        """The core accepts a registration by acknowledging it while it handles the
        Register: from now on that Register's connection is the one `identity` means."""
        if self._registering is None or self._registering[0] != identity:
            log.error("an accepted registration for %r outside its Register: not bound",
                      identity)
            return
        self.registrations.bind(*self._registering)

    async def _recv_loop(self) -> None:
        assert self._sock is not None
        # The same socket without a future per call: a frame per generated token is the
        # daemon's hottest path, and ZAP's User-Id is only read from an uncopied frame.
        queued: zmq.Socket[bytes] = zmq.Socket.shadow(self._sock.underlying)
        while True:
            await self._receive(await self._sock.recv_multipart(copy=False))
            for _ in range(READ_AT_ONCE):
                try:
                    frames = queued.recv_multipart(zmq.NOBLOCK, copy=False)
                except zmq.Again:
                    break
                await self._receive(frames)
            else:
                await asyncio.sleep(0)  # a flood of frames does not hold the event loop

    async def _receive(self, frames: list[zmq.Frame]) -> None:
        identity = frames[0].bytes
        if len(frames) != 2:
            self.dropped.record("malformed", identity, f"{len(frames) - 1} frames, not 1")
            return
        connection = connection_of(frames[1])
        try:
            message = protocol.decode_from_worker(frames[1].bytes)
        except protocol.ProtocolError as exc:
            self.dropped.record("malformed", identity, str(exc))
            return
        if isinstance(message, protocol.Register):
            await self._register(identity, connection, message)
        elif self.registrations.holds(identity, connection):
            await self._handle(identity, message)
        else:
            # Only the sender itself gets the answer: the ROUTER routes the id to it.
            self.dropped.record("unregistered", identity, type(message).__name__)
            self.send(identity, protocol.RegisterAck(accepted=False, message=REGISTER_AGAIN))

    async def _register(self, identity: bytes, connection: str,
                        message: protocol.Register) -> None:
        self._registering = (identity, connection)
        try:
            await self._handle(identity, message)
        finally:
            self._registering = None

    async def _handle(self, identity: bytes, message: protocol.WorkerMessage) -> None:
        try:
            result = self._on_message(identity, message)
            if result is not None:
                await result
        except Exception:
            log.exception("handling %s from %r failed", type(message).__name__, identity)
