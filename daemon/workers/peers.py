"""Which connection a worker frame came from, and whether that connection registered.

A ZeroMQ ROUTER knows a peer only by the routing id the peer picks for itself, so anyone
who reaches the worker socket can claim a registered worker's id (`local-sim-0`). Two
things keep such a peer from acting as, or removing, that worker:

- The ROUTER refuses a routing id that a connected peer already holds (ROUTER_HANDOVER
  stays off): the newcomer is never attached and the worker's own connection is left
  alone. With handover on, the newcomer took the id over and the worker's connection
  went silent for good: unhealthy, then gone, its process still running.
- The daemon names every connection: a ZAP handler (ZeroMQ's authentication hook, RFC 27)
  gives each connection a fresh User-Id, which ZeroMQ attaches to every frame it delivers
  and which no peer can set. A routing id belongs to the connection whose registration
  the daemon accepted (the worker key checked); a frame that claims it from any other
  connection, or claims an id nobody registered, never reaches the core. Such frames,
  and frames that are not protocol messages, are counted in
  `agentd_worker_frames_dropped_total{reason}` and logged at most once a minute per reason.

Without handover a worker's new connection cannot take its id while the old one is
open, so the broker has ZeroMQ ping every connection and close one that stops answering
(a host that lost power never closes its connections).
"""

from __future__ import annotations

import itertools
import logging
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

import zmq
import zmq.asyncio
from prometheus_client.metrics_core import Metric

from daemon.metrics import labelled_counter

log = logging.getLogger("agentd.worker_peers")

# Where libzmq sends the ZAP requests of the sockets in one context (RFC 27).
ZAP_ENDPOINT = "inproc://zeromq.zap.01"
ZAP_DOMAIN = b"agentd-workers"
_ZAP_VERSION = b"1.0"
LOG_EVERY_S = 60.0


def name_connections(sock: zmq.asyncio.Socket) -> None:
    """Have every connection of `sock` named by the ConnectionNamer of its context; call
    before bind. Enforced: without the namer, ZeroMQ refuses connections rather than let
    an unnamed one in."""
    sock.setsockopt(zmq.ZAP_DOMAIN, ZAP_DOMAIN)
    sock.setsockopt(zmq.ZAP_ENFORCE_DOMAIN, 1)


class ConnectionNamer:
    """The ZAP handler of one context: admits every connection (the worker key is checked
    at registration, and on TCP the Curve handshake comes first) under a User-Id that is
    new for each connection."""

    def __init__(self, ctx: zmq.asyncio.Context) -> None:
        self._sock = ctx.socket(zmq.REP)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.bind(ZAP_ENDPOINT)
        self._numbers = itertools.count(1)

    async def run(self) -> None:
        while True:
            request = await self._sock.recv_multipart()
            await self._sock.send_multipart(self._reply(request))

    def _reply(self, request: list[bytes]) -> list[bytes]:
        version, request_id = request[:2]  # only libzmq, in this process, asks
        if version != _ZAP_VERSION:
            return [_ZAP_VERSION, request_id, b"500", b"unknown ZAP version", b"", b""]
        return [_ZAP_VERSION, request_id, b"200", b"OK", b"%d" % next(self._numbers), b""]

    def close(self) -> None:
        self._sock.close(linger=0)


def connection_of(frame: zmq.Frame) -> str:
    """The User-Id the namer gave the frame's connection; "" when it has none."""
    try:
        return str(frame.get("User-Id"))
    except zmq.ZMQError:  # a connection the namer never saw
        return ""


@dataclass
class Registrations:
    """Routing id -> the connection whose registration the daemon accepted."""

    _connections: dict[bytes, str] = field(default_factory=dict)

    def bind(self, identity: bytes, connection: str) -> None:
        if connection:
            self._connections[identity] = connection

    def holds(self, identity: bytes, connection: str) -> bool:
        return bool(connection) and self._connections.get(identity) == connection


@dataclass
class DroppedFrames:
    """Frames the broker did not pass on: every one counted, logged at most once a minute
    per reason (a hostile or broken peer sends them as fast as it can)."""

    dropped: Counter[str] = field(default_factory=Counter)
    _last_logged: dict[str, float] = field(default_factory=dict)

    def record(self, reason: str, identity: bytes, detail: str,
               now: float | None = None) -> bool:
        """Count one; True when it was logged."""
        self.dropped[reason] += 1
        now = time.monotonic() if now is None else now
        last = self._last_logged.get(reason)
        if last is not None and now - last < LOG_EVERY_S:
            return False
        self._last_logged[reason] = now
        what = {"malformed": "a frame that is not a protocol message",
                "unregistered": "a frame from a connection that did not register as its "
                                "routing id"}.get(reason, "a frame")
        log.warning("dropped %s, from routing id %r: %s (%d so far; further ones this "
                    "minute are only counted in agentd_worker_frames_dropped_total)",
                    what, identity[:64], detail[:200], self.dropped[reason])
        return True

    def families(self) -> Iterator[Metric]:
        yield labelled_counter(
            "agentd_worker_frames_dropped_total",
            "Frames on the worker socket dropped before the core saw them, by reason",
            ["reason"], [([reason], n) for reason, n in sorted(self.dropped.items())])
