"""CurveZMQ on the worker socket: a real daemon on a TCP worker endpoint, real
`agentd worker` processes, and what an observer on the path sees."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq

from daemon.workers import curve as worker_curve
from daemon.workers import protocol
from tests.daemon_process import DaemonProcess, free_port
from tests.worker_socket import (
    chat,
    dealer,
    eventually,
    metric,
    register_frame,
    serves,
    worker_key,
)

MARKER = "zebra-marmalade-4711 is the password to the vault"


class Relay:
    """A TCP proxy on its own event loop thread that keeps every byte it forwards."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = free_port()
        self.to_daemon = bytearray()
        self.to_worker = bytearray()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Relay:
        self._thread.start()
        assert self._ready.wait(10), "the relay did not start"
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(
            asyncio.start_server(self._client, "127.0.0.1", self.port))
        self._ready.set()
        try:
            self._loop.run_forever()
        finally:
            server.close()
            for task in asyncio.all_tasks(self._loop):
                task.cancel()
            self._loop.run_until_complete(asyncio.sleep(0))
            self._loop.close()

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        await asyncio.gather(self._pipe(reader, up_writer, self.to_daemon),
                             self._pipe(up_reader, writer, self.to_worker),
                             return_exceptions=True)

    @staticmethod
    async def _pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter,
                    seen: bytearray) -> None:
        try:
            while chunk := await src.read(65536):
                seen += chunk
                dst.write(chunk)
                await dst.drain()
        finally:
            dst.close()


@pytest.fixture
def tcp_daemon(daemon_factory) -> DaemonProcess:  # type: ignore[no-untyped-def]
    """No local worker: whatever serves came in over the TCP endpoint."""
    port = free_port()
    return daemon_factory(  # type: ignore[no-any-return]
        workers=0, env={"AGENTD_WORKER_BIND": f"tcp://127.0.0.1:{port}"}).start()


def tcp_endpoint(d: DaemonProcess) -> str:
    return d.env["AGENTD_WORKER_BIND"]


@contextlib.contextmanager
def external_worker(d: DaemonProcess, connect: str, worker_id: str) -> Iterator[None]:
    assert d.config_dir is not None
    proc = subprocess.Popen(
        [sys.executable, "-m", "daemon.commands.cli", "worker", "--engine", "sim", "--worker-id",
         worker_id, "--connect", connect, "--key-file", str(d.config_dir / "worker.key")],
        env=d.process_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        d.wait_ready(1, 30)
        yield
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=20)
        assert "Traceback" not in err, err


def test_an_external_worker_serves_over_curve_on_tcp(tcp_daemon: DaemonProcess) -> None:
    d = tcp_daemon
    with external_worker(d, tcp_endpoint(d), "tcp-0"):
        assert [w["id"] for w in d.get("/v1/workers").json()["data"]] == ["tcp-0"]
        assert all(serves(d) for _ in range(3))
    assert "is not encrypted" not in d.log()
    assert metric(d, "agentd_worker_handshakes_failed_total", reason="plaintext") == 0


def test_the_path_sees_neither_prompt_nor_key(tcp_daemon: DaemonProcess) -> None:
    """Every byte between worker and daemon goes through a recording relay; the request
    completes, and neither the prompt nor the worker key is in what it recorded."""
    d = tcp_daemon
    key = worker_key(d).encode()
    with Relay(int(tcp_endpoint(d).rsplit(":", 1)[1])) as relay:
        with external_worker(d, f"tcp://127.0.0.1:{relay.port}", "relayed-0"):
            r = chat(d, "p-secret", max_tokens=5, content=MARKER)
            assert r.status_code == 200, r.text
            assert r.json()["usage"]["completion_tokens"] == 5
        seen = bytes(relay.to_daemon) + bytes(relay.to_worker)
    # Enough went through to have carried both (registration, submit, deltas)...
    assert len(relay.to_daemon) > 500 and len(relay.to_worker) > 200, (
        len(relay.to_daemon), len(relay.to_worker))
    # ...and none of it readable.
    for secret in (MARKER.encode(), b"zebra-marmalade", key, key[4:20]):
        assert secret not in seen
    assert b"register" not in seen and b"submit" not in seen


def test_the_relay_would_see_plain_zeromq() -> None:
    """The recorder itself works: plain ZeroMQ through it shows the text, so the test
    above is not passing because the relay records nothing useful."""
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    with Relay(port) as relay:
        sock = ctx.socket(zmq.DEALER)
        sock.connect(f"tcp://127.0.0.1:{relay.port}")
        sock.send(MARKER.encode())
        assert router.poll(5000)
        identity, _ = router.recv_multipart()
        router.send_multipart([identity, b"reply " + MARKER.encode()])
        assert sock.poll(5000) and sock.recv().startswith(b"reply")
        sock.close(linger=0)
    router.close(linger=0)
    ctx.term()
    assert MARKER.encode() in relay.to_daemon and MARKER.encode() in relay.to_worker


def _no_answer(sock: zmq.Socket, seconds: float) -> bool:  # type: ignore[type-arg]
    return not sock.poll(int(seconds * 1000))


def test_a_plaintext_worker_gets_nothing_and_the_daemon_serves_on(  # type: ignore[no-untyped-def]
        daemon_factory) -> None:
    """A plain ZeroMQ DEALER sending a valid registration (with the key, even) never gets
    past the handshake: no answer, not registered, counted, logged; a client with a
    different key likewise (it retries every 100 ms: counted each time, logged once)."""
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    d: DaemonProcess = daemon_factory(workers=1, env={"AGENTD_WORKER_BIND": endpoint}).start()
    plain = dealer(d, "plain-0", endpoint, encrypted=False)
    other: zmq.Socket = zmq.Context.instance().socket(zmq.DEALER)  # type: ignore[type-arg]
    def failed(reason: str) -> float:
        return metric(d, "agentd_worker_handshakes_failed_total", reason=reason)

    try:
        plain.send(register_frame(d, "plain-0"))
        assert _no_answer(plain, 2)
        # Which side notices the plaintext peer first is a race (see failure_reason).
        assert eventually(lambda: failed("plaintext") + failed("aborted") >= 1)
        # Curve, but with another deployment's key.
        other.setsockopt(zmq.LINGER, 0)
        other.setsockopt(zmq.IDENTITY, b"other-0")
        worker_curve.make_client(other, "agw_another-deployments-key")
        other.connect(endpoint)
        other.send(register_frame(d, "other-0"))
        assert _no_answer(other, 1.0)
        assert eventually(lambda: failed("wrong_key") >= 3)
    finally:
        # Closed at once: a client retrying for over a minute would be logged again.
        plain.close()
        other.close()
    assert all(serves(d) for _ in range(3))
    assert [w["id"] for w in d.get("/v1/workers").json()["data"]] == ["local-sim-0"]
    assert metric(d, "agentd_worker_registrations_refused_total", reason="key") == 0
    assert d.log().count("with a different worker key") == 1
    assert d.log().count("dropped before it could send a frame") <= 3  # once per reason
    assert "Traceback" not in d.log()
    # A worker that does it right, on the same socket, is answered at once.
    good = dealer(d, "good-0", endpoint)
    try:
        good.send(register_frame(d, "good-0"))
        assert good.poll(5000)
        ack = protocol.decode_from_daemon(good.recv())
        assert isinstance(ack, protocol.RegisterAck) and ack.accepted
    finally:
        good.close()



def test_a_worker_with_another_key_exits_with_one_line(tcp_daemon: DaemonProcess,
                                                        tmp_path: Path) -> None:
    """The handshake fails before any registration: the worker says why and exits 1
    instead of retrying forever; the daemon counts it and serves on."""
    d = tcp_daemon
    (tmp_path / "other.key").write_text("agw_another-deployments-key\n")
    out = subprocess.run(
        [sys.executable, "-m", "daemon.commands.cli", "worker", "--engine", "sim", "--connect",
         tcp_endpoint(d), "--key-file", str(tmp_path / "other.key")],
        env=d.process_env(), capture_output=True, text=True, timeout=60)
    assert out.returncode == 1, out.stderr
    last = out.stderr.strip().splitlines()[-1]
    assert "refused the encrypted handshake" in last and "--key-file" in last, out.stderr
    assert metric(d, "agentd_worker_handshakes_failed_total", reason="wrong_key") >= 1
    assert d.get("/v1/workers").json()["data"] == []


def test_a_worker_meeting_a_plaintext_daemon_exits_with_one_line(tmp_path: Path) -> None:
    """An older daemon (plain ZeroMQ) on the TCP endpoint: the worker does not send its
    key in the clear, and says why it stops."""
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    (tmp_path / "worker.key").write_text("agw_some-key\n")
    try:
        out = subprocess.run(
            [sys.executable, "-m", "daemon.commands.cli", "worker", "--engine", "sim", "--connect",
             f"tcp://127.0.0.1:{port}", "--key-file", str(tmp_path / "worker.key")],
            capture_output=True, text=True, timeout=60)
        assert not router.poll(0), "a frame got through to the plaintext daemon"
    finally:
        router.close(linger=0)
        ctx.term()
    assert out.returncode == 1, out.stderr
    assert "refused the encrypted handshake" in out.stderr.strip().splitlines()[-1]
