"""Talking to a test daemon's worker socket the way a worker does (for protocol tests)."""

from __future__ import annotations

import contextlib
import sqlite3
from typing import Any

import zmq

from daemon import protocol
from daemon.worker_key import key_path
from tests.daemon_process import DaemonProcess


def worker_key(d: DaemonProcess) -> str:
    """The key the daemon created on its first start; workers must present it."""
    assert d.config_dir is not None
    return key_path(d.config_dir).read_text().strip()


def dealer(d: DaemonProcess, identity: str) -> zmq.Socket:  # type: ignore[type-arg]
    sock: zmq.Socket = zmq.Context.instance().socket(zmq.DEALER)  # type: ignore[type-arg]
    sock.setsockopt(zmq.IDENTITY, identity.encode())
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(f"ipc://{d.data_dir / 'workers.sock'}")
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
