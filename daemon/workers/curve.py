"""CurveZMQ on the worker socket, keyed by the worker key (daemon/workers/key.py).

One file still does it all: the daemon's Curve server keypair is derived from the
worker key, so a worker holding a copy of worker.key computes the server's public key
and connects with a throwaway client keypair. Everything on the wire, the key in the
registration included, is then encrypted to the daemon, and a peer without the key
(or speaking plain ZeroMQ) never completes the handshake: ZeroMQ drops it before any
frame reaches the broker. The registration check on the key stays as a second line.

Only network endpoints are encrypted, not `ipc://`: an ipc socket is a file in the
daemon's data dir that never leaves the host (reading its traffic takes the daemon
user's or root's rights, which read worker.key too), and Curve measurably cuts the
socket's message rate there (bench/worker_curve.py, medians: token deltas/s through the
broker 51k -> 38k, round trips/s 7.4k -> 4.1k on ipc). Both ends apply the same rule to
the same endpoint.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

import zmq
from prometheus_client.metrics_core import Metric
from zmq.utils import z85

from daemon.metrics import labelled_counter

log = logging.getLogger("agentd.worker_curve")

# Versioned, so a future change of derivation cannot silently pair with this one.
_DERIVATION = b"agentd worker curve v1"

HANDSHAKE_FAILED_EVENTS = (zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
                           | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                           | zmq.EVENT_HANDSHAKE_FAILED_AUTH)


def encrypts(endpoint: str) -> bool:
    return not endpoint.startswith("ipc://")


def server_keys(worker_key: str) -> tuple[bytes, bytes]:
    """(public, secret), Z85: the daemon's Curve keypair for this worker key."""
    secret = z85.encode(hashlib.sha256(_DERIVATION + worker_key.encode()).digest())
    return zmq.curve_public(secret), secret


def make_server(sock: zmq.Socket, worker_key: str) -> None:  # type: ignore[type-arg]
    public, secret = server_keys(worker_key)
    sock.setsockopt(zmq.CURVE_SERVER, 1)
    sock.setsockopt(zmq.CURVE_PUBLICKEY, public)
    sock.setsockopt(zmq.CURVE_SECRETKEY, secret)


def make_client(sock: zmq.Socket, worker_key: str) -> None:  # type: ignore[type-arg]
    # Ephemeral: the daemon authenticates workers by the key in Register, not by a
    # client keypair, so there is no second file to distribute.
    public, secret = zmq.curve_keypair()
    sock.setsockopt(zmq.CURVE_PUBLICKEY, public)
    sock.setsockopt(zmq.CURVE_SECRETKEY, secret)
    sock.setsockopt(zmq.CURVE_SERVERKEY, server_keys(worker_key)[0])


def failure_reason(event: int, value: int) -> str | None:
    """Why a handshake failed, from a socket monitor event; None when it is not one."""
    if not event & HANDSHAKE_FAILED_EVENTS:
        return None
    if value == zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH:
        return "plaintext"  # a peer without CurveZMQ: an old agentd, or not a worker
    if value == zmq.PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC:
        return "wrong_key"  # its server key is not derived from our worker key
    if event & zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL:
        # The socket failed mid-handshake (value is an errno). A plaintext peer that saw
        # the mismatch first and hung up ends up here, not under "plaintext": a race.
        return "aborted"
    return "other"


@dataclass
class HandshakeTally:
    """Failed handshakes on the worker socket: every one counted, logged at most once a
    minute per reason (a peer retries every 100 ms, so one bad worker is a stream)."""

    failed: Counter[str] = field(default_factory=Counter)
    _last_logged: dict[str, float] = field(default_factory=dict)

    def record(self, reason: str, endpoint: str, now: float | None = None) -> bool:
        self.failed[reason] += 1
        now = time.monotonic() if now is None else now
        last = self._last_logged.get(reason)
        if last is not None and now - last < 60.0:
            return False
        self._last_logged[reason] = now
        what = {"plaintext": "without encryption (plain ZeroMQ or an older agentd)",
                "wrong_key": "with a different worker key",
                "aborted": "and hung up mid-handshake (plain ZeroMQ, a scanner, the network)",
                }.get(reason, "and failed the handshake")
        log.warning("a peer connected to the worker socket %s %s: dropped before it could "
                    "send a frame (%d so far; agentd_worker_handshakes_failed_total)",
                    endpoint, what, self.failed[reason])
        return True

    def families(self) -> Iterator[Metric]:
        yield labelled_counter(
            "agentd_worker_handshakes_failed_total",
            "Connections to the worker socket that failed the CurveZMQ handshake",
            ["reason"], [([reason], n) for reason, n in sorted(self.failed.items())])
