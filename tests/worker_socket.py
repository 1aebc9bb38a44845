"""Talking to a test daemon's worker socket the way a worker does (for protocol tests)."""

from __future__ import annotations

import contextlib
import sqlite3
import time
from collections.abc import Callable
from typing import Any

import httpx
import zmq

from console.client import metric_samples
from daemon.workers import curve as worker_curve
from daemon.workers import protocol
from daemon.workers.key import key_path
from tests.daemon_process import DaemonProcess
from tests.waiting import wait_for

MODEL = "sim-llama3-8b"


def worker_key(d: DaemonProcess) -> str:
    """The key the daemon created on its first start; workers must present it."""
    assert d.config_dir is not None
    return key_path(d.config_dir).read_text().strip()


def dealer(d: DaemonProcess, identity: str, endpoint: str | None = None,
           encrypted: bool | None = None) -> zmq.Socket:  # type: ignore[type-arg]
    """A DEALER on the daemon's worker socket (default: its ipc file). `encrypted`: a
    CurveZMQ client of the daemon's key, as real workers are on network endpoints
    (default: as a real worker would be on `endpoint`)."""
    endpoint = endpoint or f"ipc://{d.data_dir / 'workers.sock'}"
    sock: zmq.Socket = zmq.Context.instance().socket(zmq.DEALER)  # type: ignore[type-arg]
    sock.setsockopt(zmq.IDENTITY, identity.encode())
    sock.setsockopt(zmq.LINGER, 0)
    if worker_curve.encrypts(endpoint) if encrypted is None else encrypted:
        worker_curve.make_client(sock, worker_key(d))
    sock.connect(endpoint)
    return sock


def register_frame(d: DaemonProcess, worker_id: str, **fields: Any) -> bytes:
    """A valid registration with the daemon's key; `fields` override any field."""
    values: dict[str, Any] = {
        "worker_id": worker_id, "engine": "sim", "model": "raw-model",
        "kv_capacity_tokens": 1024, "block_size": 16, "max_batch": 4,
        "schema_hash": protocol.SCHEMA_HASH, "key": worker_key(d), **fields}
    return protocol.encode(protocol.Register(**values))


def worker_events(d: DaemonProcess, kind: str) -> list[str]:
    """worker_id of each flushed trace event of `kind` (worker events have no session)."""
    with contextlib.closing(sqlite3.connect(f"file:{d.data_dir / 'agentd.db'}?mode=ro",
                                            uri=True)) as db:
        rows = db.execute("SELECT worker_id FROM trace_events WHERE kind = ? ORDER BY id",
                          (kind,)).fetchall()
    return [r[0] for r in rows]


def chat(d: DaemonProcess, program: str, max_tokens: int = 4, timeout: float = 30,
         content: str = "hi") -> httpx.Response:
    body = {"model": MODEL, "max_tokens": max_tokens, "program_id": program,
            "messages": [{"role": "user", "content": content}]}
    return httpx.post(f"{d.url}/v1/chat/completions", json=body, headers=d.auth_headers(),
                      timeout=timeout)


def serves(d: DaemonProcess) -> bool:
    r = chat(d, f"p-probe-{time.monotonic_ns()}", 3)
    return r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3


def metric(d: DaemonProcess, name: str, **labels: str) -> float:
    """One sample from /metrics; 0 when the daemon has not exposed it (yet)."""
    for sample, have, value in metric_samples(d.get("/metrics").text):
        if sample == name and have == labels:
            return value
    return 0.0


def eventually(check: Callable[[], bool], within: float = 10.0) -> bool:
    """Whether `check` holds within `within` s; the caller asserts it with its own message."""
    try:
        wait_for(check, within, "a condition")
    except AssertionError:
        return False
    return True
