"""Worker runtime: connects a DEALER to the daemon's ROUTER and drives one Engine.

It registers, answers submits by streaming the engine's deltas back, aborts on
request, and sends a heartbeat with the engine's stats on the interval the
daemon asked for. If the daemon goes away the worker keeps retrying to
register, so a restarted daemon gets its workers back without operator action;
a worker the daemon's supervisor started dies with that daemon instead
(daemon/workers/local.py).
A worker may be given several daemon endpoints (an active daemon and its standbys,
daemon/standby/): its socket connects to all of them and sends only over connections that
are up (ZMQ_IMMEDIATE). Only the daemon holding the store's lease binds its endpoint, so
that is where it registers; when that daemon dies and a standby takes over and binds, the
next heartbeat reaches the new daemon, which does not know the worker and asks it to
register again, as a restarted daemon does.
On a network endpoint the socket is a CurveZMQ client of a server key derived from the
worker key (daemon/workers/curve.py); a daemon that fails the handshake (it holds another key,
or does not encrypt) ends the worker with one line, as a refused registration does.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import uuid

import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from daemon.engines.base import Engine
from daemon.workers import curve as worker_curve
from daemon.workers import protocol
from daemon.workers.local import die_with_daemon
from daemon.workers.protocol import Abort, Finish, RegisterAck, Shutdown, Submit

log = logging.getLogger("agentd.worker")

REGISTER_TIMEOUT_S = 5.0
# Consecutive failed handshakes before giving up: on this side a wrong key and a daemon
# that hung up mid-handshake look alike, and only the first repeats (every ~100 ms).
HANDSHAKE_FAILURES_TO_EXIT = 3


class EndpointError(ValueError):
    """A worker's daemon endpoints are missing or mixed."""


def endpoints(connect: str | list[str]) -> list[str]:
    """The daemon endpoints in `connect`: one, a comma-separated list, or a list of either.
    All tcp:// or all ipc:// (one socket is encrypted or not as a whole)."""
    given = [connect] if isinstance(connect, str) else connect
    found = [e.strip() for item in given for e in item.split(",") if e.strip()]
    if not found:
        raise EndpointError("no daemon endpoint given (--connect tcp://HOST:PORT)")
    if len({worker_curve.encrypts(e) for e in found}) > 1:
        raise EndpointError("daemon endpoints must be all tcp:// or all ipc://, not both: "
                            + ",".join(found))
    return found


class WorkerRuntime:
    def __init__(self, engine: Engine, connect: str | list[str], worker_id: str | None = None,
                 key: str = "", node: str = "", dp_rank: int | None = None) -> None:
        self.engine = engine
        self.endpoints = endpoints(connect)
        self.connect = ",".join(self.endpoints)  # as messages name it
        self.key = key  # the daemon's worker key (daemon/workers/key.py)
        # Its identity beside the id: the node it runs on (the host name unless its placer
        # names the node, as Ray placement does) and its data-parallel rank, if it has one.
        self.node = node or socket.gethostname()
        self.dp_rank = dp_rank
        self.worker_id = worker_id or f"{engine.engine}-{uuid.uuid4().hex[:8]}"
        self._ctx = zmq.asyncio.Context()
        self._sock: zmq.asyncio.Socket | None = None
        self._monitor: zmq.asyncio.Socket | None = None
        self._handshake_failures = 0
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._heartbeat_interval = 0.5
        self._stopping = asyncio.Event()
        self._send_lock = asyncio.Lock()
        self._last_contact = 0.0
        self.engine_died = False  # it stopped because its engine died (exit non-zero)

    async def run(self) -> None:
        die_with_daemon()  # before the engine loads: that can take a while
        await self.engine.start()
        try:
            fresh = True
            while not self._stopping.is_set():
                if await self._register(fresh):
                    await self._serve()
                    # Asked to register again (a restarted daemon, or a standby that took
                    # over): over the same connection. A new socket would reconnect with
                    # the same routing id while the daemon may still hold the old
                    # connection, and the daemon refuses a second one with a live id
                    # (daemon/workers/peers.py): its answer would go to the old one.
                    fresh = False
                else:
                    fresh = True
                    await self._pause(1.0)
        finally:
            for task in self._tasks.values():
                task.cancel()
            await self.engine.shutdown()
            self._close_socket()
            self._ctx.term()

    def stop(self) -> None:
        self._stopping.set()

    async def _pause(self, seconds: float) -> None:
        """Sleep, unless stopped meanwhile."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), seconds)

    def _close_socket(self) -> None:
        if self._sock is None:
            return
        if self._monitor is not None:
            self._sock.disable_monitor()
            self._monitor.close(linger=0)
            self._monitor = None
        self._sock.close(linger=0)
        self._sock = None

    def _new_socket(self) -> zmq.asyncio.Socket:
        self._close_socket()
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.IDENTITY, self.worker_id.encode())
        sock.setsockopt(zmq.LINGER, 0)
        if len(self.endpoints) > 1:  # queue to the daemon that is up, not to one that is not
            sock.setsockopt(zmq.IMMEDIATE, 1)
        if worker_curve.encrypts(self.endpoints[0]):  # all alike (`endpoints`)
            worker_curve.make_client(sock, self.key)
            self._monitor = sock.get_monitor_socket(
                worker_curve.HANDSHAKE_FAILED_EVENTS | zmq.EVENT_HANDSHAKE_SUCCEEDED)
        for endpoint in self.endpoints:
            sock.connect(endpoint)
        self._sock = sock
        return sock

    async def _check_handshake(self) -> None:
        """Exit when handshakes keep failing: retrying cannot help, the keys differ."""
        while self._monitor is not None and await self._monitor.poll(0):
            event = parse_monitor_message(await self._monitor.recv_multipart())
            reason = worker_curve.failure_reason(event["event"], event["value"])
            if reason is None:  # a handshake succeeded
                self._handshake_failures = 0
                continue
            self._handshake_failures += 1
            # A mechanism mismatch is never transient; which side sees it first is a race.
            if reason == "plaintext" or self._handshake_failures >= HANDSHAKE_FAILURES_TO_EXIT:
                raise SystemExit(
                    f"agentd worker: the daemon at {self.connect} refused the encrypted "
                    "handshake: this worker key is not the daemon's (or the daemon is an "
                    "agentd without worker encryption); copy <config dir>/worker.key from "
                    "the daemon's host and pass --key-file")

    async def _register(self, fresh: bool = True) -> bool:
        sock = self._new_socket() if fresh or self._sock is None else self._sock
        reg = protocol.Register(
            worker_id=self.worker_id,
            engine=self.engine.engine,
            model=self.engine.model,
            kv_capacity_tokens=self.engine.kv_capacity_tokens,
            block_size=self.engine.block_size,
            max_batch=self.engine.max_batch,
            schema_hash=protocol.SCHEMA_HASH,
            pid=os.getpid(),
            host=socket.gethostname(),
            key=self.key,
            tools=self.engine.tools,
            kv_events=self.engine.kv_events,
            node=self.node,
            dp_rank=self.dp_rank,
        )
        await sock.send(protocol.encode(reg))
        msg = await self._await_ack(sock)
        if msg is None:
            if not self._stopping.is_set():
                log.warning("no answer from daemon at %s; retrying", self.connect)
            return False
        if not msg.accepted:
            raise SystemExit(f"agentd worker: the daemon refused registration: {msg.message}")
        self._heartbeat_interval = msg.heartbeat_interval_s
        log.info("registered as %s with %s", self.worker_id, self.connect)
        return True

    async def _await_ack(self, sock: zmq.asyncio.Socket) -> RegisterAck | None:
        """The daemon's answer; anything else before it is meant for a previous session."""
        deadline = asyncio.get_running_loop().time() + REGISTER_TIMEOUT_S
        while (left := deadline - asyncio.get_running_loop().time()) > 0:
            if self._stopping.is_set():  # stopped while no daemon answers: do not wait
                return None
            await self._check_handshake()
            # Short polls: a failed handshake shows on the monitor, not on the socket.
            if not await sock.poll(min(left, 0.2) * 1000):
                continue
            try:
                msg = protocol.decode_from_daemon(await sock.recv())
            except protocol.ProtocolError:
                continue
            if isinstance(msg, RegisterAck) and msg.message != protocol.REGISTER_AGAIN:
                return msg
        return None

    async def _serve(self) -> None:
        assert self._sock is not None
        heartbeat = asyncio.create_task(self._heartbeat_loop())
        try:
            while not self._stopping.is_set():
                if not await self._sock.poll(200):
                    # A daemon restarted with a rotated key fails the reconnect.
                    await self._check_handshake()
                    continue
                frame = await self._sock.recv()
                try:
                    msg = protocol.decode_from_daemon(frame)
                except protocol.ProtocolError as exc:
                    log.warning("dropping malformed frame from daemon: %s", exc)
                    continue
                if isinstance(msg, Submit):
                    self._tasks[msg.request_id] = asyncio.create_task(self._run_request(msg))
                elif isinstance(msg, Abort):
                    if msg.request_id in self._tasks:
                        await self.engine.abort(msg.request_id)
                elif isinstance(msg, Shutdown):
                    self._stopping.set()
                elif isinstance(msg, RegisterAck) and not msg.accepted:
                    # The daemon restarted and forgot us: register again.
                    return
        finally:
            heartbeat.cancel()

    async def _send(self, message: protocol.Message) -> None:
        assert self._sock is not None
        async with self._send_lock:
            await self._sock.send(protocol.encode(message))

    async def _heartbeat_loop(self) -> None:
        everything = True  # a daemon that (re)registered us knows no residency yet
        while True:
            if self.engine.dead:
                log.error("the %s engine died: this worker exits, so that its supervisor "
                          "starts a new one", self.engine.engine)
                self.engine_died = True
                self._stopping.set()
                return
            residency, dropped = self.engine.residency_report(everything)
            everything = False
            await self._send(protocol.Heartbeat(
                worker_id=self.worker_id, stats=self.engine.stats(), residency=residency,
                residency_dropped=dropped))
            await asyncio.sleep(self._heartbeat_interval)

    async def _run_request(self, submit: Submit) -> None:
        try:
            async for out in self.engine.generate(submit):
                await self._send(out)
        except Exception as exc:  # an engine failure ends this request, not the worker
            log.exception("request %s failed in the engine", submit.request_id)
            await self._send(
                Finish(
                    request_id=submit.request_id, reason="error", prompt_tokens=0,
                    cached_tokens=0, output_tokens=0, error=f"{type(exc).__name__}: {exc}",
                )
            )
        finally:
            self._tasks.pop(submit.request_id, None)
