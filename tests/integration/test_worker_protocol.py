"""The engine protocol at the socket: registration checks and malformed frames."""

from __future__ import annotations

import time

import msgspec
import zmq

from daemon import protocol
from tests.daemon_process import DaemonProcess


def dealer(d: DaemonProcess, identity: str) -> zmq.Socket:  # type: ignore[type-arg]
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.IDENTITY, identity.encode())
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(f"ipc://{d.data_dir / 'workers.sock'}")
    return sock


def register(worker_id: str, schema_hash: str = protocol.SCHEMA_HASH) -> protocol.Register:
    return protocol.Register(
        worker_id=worker_id, engine="sim", model="raw-model", kv_capacity_tokens=1024,
        block_size=16, max_batch=4, schema_hash=schema_hash,
    )


def ack(sock: zmq.Socket) -> protocol.RegisterAck:  # type: ignore[type-arg]
    assert sock.poll(5000), "no answer from the daemon"
    msg = protocol.decode_from_daemon(sock.recv())
    assert isinstance(msg, protocol.RegisterAck)
    return msg


def test_schema_mismatch_is_refused_with_a_clear_message(sim_daemon: DaemonProcess) -> None:
    sock = dealer(sim_daemon, "old-worker")
    sock.send(protocol.encode(register("old-worker", schema_hash="0000000000000000")))
    reply = ack(sock)
    assert not reply.accepted
    assert "schema mismatch" in reply.message and protocol.SCHEMA_HASH in reply.message
    ids = [w["id"] for w in sim_daemon.get("/v1/workers").json()["data"]]
    assert "old-worker" not in ids
    sock.close()


def test_malformed_frames_do_not_hurt_the_daemon(sim_daemon: DaemonProcess) -> None:
    sock = dealer(sim_daemon, "fuzzer")
    for frame in (b"", b"\xff\xfe garbage", msgspec.msgpack.encode({"type": "nope"}),
                  msgspec.msgpack.encode({"type": "register", "worker_id": 5})):
        sock.send(frame)
    sock.send_multipart([b"a", b"b", b"c"])
    time.sleep(0.3)
    assert sim_daemon.get("/healthz").json()["workers_healthy"] == 1
    # The daemon still serves: a well-formed registration on the same socket is accepted.
    sock.send(protocol.encode(register("fuzzer")))
    assert ack(sock).accepted
    sock.close()


def test_unknown_worker_heartbeat_is_told_to_register(sim_daemon: DaemonProcess) -> None:
    sock = dealer(sim_daemon, "stranger")
    stats = protocol.WorkerStats(kv_capacity_tokens=1, kv_used_tokens=0, running=0, waiting=0)
    sock.send(protocol.encode(protocol.Heartbeat(worker_id="stranger", stats=stats)))
    reply = ack(sock)
    assert not reply.accepted and "register again" in reply.message
    sock.close()


def test_silent_worker_becomes_unhealthy(sim_daemon: DaemonProcess) -> None:
    sock = dealer(sim_daemon, "quiet")
    sock.send(protocol.encode(register("quiet")))
    assert ack(sock).accepted
    deadline = time.time() + 10
    status = None
    while time.time() < deadline:
        [w] = [w for w in sim_daemon.get("/v1/workers").json()["data"] if w["id"] == "quiet"]
        status = w["status"]
        if status == "unhealthy":
            break
        time.sleep(0.2)
    assert status == "unhealthy"
    sock.close()
