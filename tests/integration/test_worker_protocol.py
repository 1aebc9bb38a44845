"""The engine protocol at the socket: registration checks (schema, worker key), malformed
frames, peers that claim a registered worker's routing id, and workers that misbehave
while registered (slow, stuck, forging, lying, oversized)."""

from __future__ import annotations

import contextlib
import os
import queue
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx
import msgspec
import zmq

from daemon.workers import protocol
from tests.daemon_process import DaemonProcess
from tests.waiting import wait_for
from tests.worker_socket import (
    MODEL,
    chat,
    dealer,
    eventually,
    metric,
    register_frame,
    serves,
    worker_events,
    worker_key,
)


def ack(sock: zmq.Socket) -> protocol.RegisterAck:  # type: ignore[type-arg]
    assert sock.poll(5000), "no answer from the daemon"
    msg = protocol.decode_from_daemon(sock.recv())
    assert isinstance(msg, protocol.RegisterAck)
    return msg


def test_schema_mismatch_is_refused_with_a_clear_message(sim_daemon: DaemonProcess) -> None:
    sock = dealer(sim_daemon, "old-worker")
    sock.send(register_frame(sim_daemon, "old-worker", schema_hash="0000000000000000"))
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
    sock.send(register_frame(sim_daemon, "fuzzer"))
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
    sock.send(register_frame(sim_daemon, "quiet"))
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


# --- workers that misbehave while registered ----------------------------------------------

Answer = Callable[[protocol.Submit], list[protocol.WorkerMessage]]


class FakeWorker:
    """A worker that speaks the protocol from the test: it registers (with the daemon's
    worker key unless `key` is given), heartbeats (so it stays healthy) and answers each
    Submit with what `answer` returns (nothing: it never answers). Registered with a huge
    KV capacity, so the scheduler likes it."""

    def __init__(self, d: DaemonProcess, worker_id: str, answer: Answer | None = None,
                 key: str | None = None, **register: Any) -> None:
        self.sock = dealer(d, worker_id)
        self.worker_id = worker_id
        self.answer = answer
        self.submits: list[protocol.Submit] = []
        self.aborts: list[str] = []
        self.outbox: queue.Queue[protocol.WorkerMessage] = queue.Queue()
        fields = {"worker_id": worker_id, "engine": "sim", "model": MODEL,
                  "kv_capacity_tokens": 10_000_000, "block_size": 16, "max_batch": 256,
                  "schema_hash": protocol.SCHEMA_HASH,
                  "key": worker_key(d) if key is None else key, **register}
        self.sock.send(protocol.encode(protocol.Register(**fields)))
        self.ack = ack(self.sock)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        beat = 0.0
        while not self._stop.is_set():
            if time.time() - beat > 0.2:
                stats = protocol.WorkerStats(kv_capacity_tokens=10_000_000, kv_used_tokens=0,
                                             running=len(self.submits), waiting=0)
                self.sock.send(protocol.encode(protocol.Heartbeat(worker_id=self.worker_id,
                                                                  stats=stats)))
                beat = time.time()
            while not self.outbox.empty():
                self.sock.send(protocol.encode(self.outbox.get()))
            if self.sock.poll(20):
                msg = protocol.decode_from_daemon(self.sock.recv())
                if isinstance(msg, protocol.Submit):
                    self.submits.append(msg)
                    for reply in (self.answer(msg) if self.answer else []):
                        self.sock.send(protocol.encode(reply))
                elif isinstance(msg, protocol.Abort):
                    self.aborts.append(msg.request_id)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.sock.close()


# --- peers that claim a registered worker's routing id ------------------------------------

STATS = protocol.WorkerStats(kv_capacity_tokens=10_000_000, kv_used_tokens=0, running=0,
                             waiting=0)


def _statuses(d: DaemonProcess) -> dict[str, str]:
    return {w["id"]: w["status"] for w in d.get("/v1/workers").json()["data"]}


def test_a_peer_claiming_a_live_workers_routing_id_cannot_remove_it(
        sim_daemon: DaemonProcess) -> None:
    """Issue 21, defect 6: a keyless DEALER with the routing id `local-sim-0` sent one junk
    frame; the socket handed the id over to it, the real worker's heartbeats stopped
    arriving, and the worker went unhealthy, then gone. Now the newcomer is refused the
    id: the worker stays healthy for three heartbeat timeouts and serves throughout, and
    the spoofer is sent nothing."""
    d = sim_daemon
    spoofer = dealer(d, "local-sim-0")
    try:
        spoofer.send(b"\xff junk")
        spoofer.send(protocol.encode(protocol.Heartbeat(worker_id="local-sim-0", stats=STATS)))
        until = time.monotonic() + 3 * 1.5
        while time.monotonic() < until:
            assert _statuses(d) == {"local-sim-0": "healthy"}
            assert serves(d)
        assert not spoofer.poll(0), "the spoofer was sent something"
    finally:
        spoofer.close()


def test_frames_claiming_an_absent_workers_routing_id_are_dropped_and_counted(
        sim_daemon: DaemonProcess) -> None:
    """Once a registered worker's connection is gone, anyone may take its routing id; that
    peer's frames are still not the worker's: its heartbeats do not revive the worker,
    they are dropped, counted and answered "register again", and it gets no prompt."""
    d = sim_daemon
    FakeWorker(d, "away-0").close()
    wait_for(lambda: _statuses(d)["away-0"] == "unhealthy", 10, "the closed worker's silence")
    spoofer = dealer(d, "away-0")
    try:
        spoofer.send(b"\xff junk")
        until = time.monotonic() + 2 * 1.5  # beats for two heartbeat timeouts
        while time.monotonic() < until:
            spoofer.send(protocol.encode(protocol.Heartbeat(worker_id="away-0", stats=STATS)))
            assert _statuses(d)["away-0"] in ("unhealthy", "gone")
            assert serves(d)
        beats = wait_for(lambda: metric(d, "agentd_worker_frames_dropped_total",
                                        reason="unregistered"), 5, "the beats counted")
        assert beats >= 5
        assert metric(d, "agentd_worker_frames_dropped_total", reason="malformed") == 1
        answers = []
        while spoofer.poll(500):
            answers.append(protocol.decode_from_daemon(spoofer.recv()))
        assert answers and all(a == protocol.RegisterAck(
            accepted=False, message="unknown worker: register again") for a in answers)
    finally:
        spoofer.close()


def test_a_flood_of_junk_frames_is_counted_not_logged_frame_by_frame(
        sim_daemon: DaemonProcess) -> None:
    """Issue 21, defect 10: 1,400 malformed frames wrote 1,380 warning lines. They are all
    counted, and logged at most once a minute."""
    d = sim_daemon
    sock = dealer(d, "junk-flood")
    try:
        for n in range(1400):
            sock.send(b"\xc1 not msgpack %d" % n)
        wait_for(lambda: metric(d, "agentd_worker_frames_dropped_total",
                                reason="malformed") == 1400, 30, "1,400 frames counted")
    finally:
        sock.close()
    assert d.log_path is not None
    lines = [line for line in d.log_path.read_text().splitlines() if "junk-flood" in line]
    assert len(lines) == 1, lines[:5]
    assert serves(d)


# --- the worker key -----------------------------------------------------------------------


def test_a_worker_without_the_right_key_is_refused_and_gets_no_prompts(
        sim_daemon: DaemonProcess) -> None:
    """Reaching the socket is not enough: a registration without the key or with a wrong
    one is refused, logged, never listed, and the (very attractive) fake gets no prompt."""
    d = sim_daemon
    path = d.config_dir / "worker.key"  # type: ignore[operator]
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    keyless = FakeWorker(d, "keyless-0", key="")
    wrong = FakeWorker(d, "wrong-key-0", key="agw_" + "A" * 43)
    try:
        for fake in (keyless, wrong):
            assert not fake.ack.accepted and "worker key missing or wrong" in fake.ack.message
        assert all(serves(d) for _ in range(4))
        assert [w["id"] for w in d.get("/v1/workers").json()["data"]] == ["local-sim-0"]
        assert keyless.submits == [] and wrong.submits == []
        assert metric(d, "agentd_worker_registrations_refused_total", reason="key") == 2
        assert "refused worker 'wrong-key-0': worker key missing or wrong" in d.log()
    finally:
        keyless.close()
        wrong.close()
    # The right key still works, on the same daemon.
    FakeWorker(d, "keyed-0").close()
    assert "keyed-0" in [w["id"] for w in d.get("/v1/workers").json()["data"]]


def test_an_external_worker_needs_the_key_file(daemon_factory, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """`agentd worker --connect`: no key file, one readable line and exit 1; a wrong key,
    refused at registration; the daemon's key file, registered and serving. The key
    survives a daemon restart, so workers that outlive a crash register again."""
    d: DaemonProcess = daemon_factory(workers=0).start()
    key = worker_key(d)
    cmd = [sys.executable, "-m", "daemon.commands.cli", "worker", "--engine", "sim", "--worker-id",
           "ext-0", "--connect", f"ipc://{d.data_dir / 'workers.sock'}"]
    # The default key file is the one in $AGENTD_CONFIG_DIR: point it somewhere empty.
    env = {**os.environ, "AGENTD_CONFIG_DIR": str(tmp_path / "no-config")}
    missing = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    assert missing.returncode == 1, missing.stderr
    [line] = missing.stderr.strip().splitlines()
    assert "cannot read the worker key file" in line and "--key-file" in line
    (tmp_path / "wrong.key").write_text("agw_not-the-key\n")
    wrong = subprocess.run([*cmd, "--key-file", str(tmp_path / "wrong.key")], env=env,
                           capture_output=True, text=True, timeout=60)
    assert wrong.returncode == 1 and "worker key missing or wrong" in wrong.stderr
    d.stop()
    d.start(wait_workers=0)
    assert worker_key(d) == key
    good = subprocess.Popen([*cmd, "--key-file", str(d.config_dir / "worker.key")], env=env,  # type: ignore[operator]
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        d.wait_ready(1, 30)
        assert [w["id"] for w in d.get("/v1/workers").json()["data"]] == ["ext-0"]
        assert serves(d)
    finally:
        good.terminate()
        good.wait(20)


def _spread(d: DaemonProcess, prefix: str, n: int = 8
            ) -> tuple[dict[str, float], list[threading.Thread]]:
    """n concurrent one-request programs; returns {program: seconds} as they complete."""
    done: dict[str, float] = {}

    def one(program: str) -> None:
        t0 = time.time()
        with contextlib.suppress(httpx.HTTPError):  # a request still held at the end
            if chat(d, program, timeout=60).status_code == 200:
                done[program] = time.time() - t0

    threads = [threading.Thread(target=one, args=(f"{prefix}-{i}",), daemon=True)
               for i in range(n)]
    for t in threads:
        t.start()
    return done, threads


def _join(threads: list[threading.Thread], within: float) -> None:
    deadline = time.time() + within
    for t in threads:
        t.join(max(0.0, deadline - time.time()))


def _held_by(worker: FakeWorker, n: int, done: dict[str, float], within: float) -> None:
    deadline = time.time() + within
    while len(done) + len(worker.submits) < n and time.time() < deadline:
        time.sleep(0.05)
    assert worker.submits, "nothing went to the fake worker: the test proved nothing"


def test_a_slow_worker_does_not_stall_the_others(sim_daemon: DaemonProcess) -> None:
    """A worker that heartbeats (so it stays healthy) but never answers holds the requests
    it was given; requests on the other worker finish at once and the API answers; when it
    goes silent too, what it held moves to the other worker and finishes."""
    slow = FakeWorker(sim_daemon, "slow-0")
    try:
        done, threads = _spread(sim_daemon, "p-slow")
        _held_by(slow, 8, done, within=10)
        held = len(slow.submits)
        assert len(done) == 8 - held and all(s < 5 for s in done.values()), done
        t0 = time.time()
        assert sim_daemon.get("/healthz").json()["status"] == "ok"
        assert [w for w in sim_daemon.get("/v1/workers").json()["data"] if w["id"] == "slow-0"]
        assert time.time() - t0 < 2
    finally:
        slow.close()  # silent from now on: the heartbeat timeout (1.5 s) takes it out
    _join(threads, 30)
    assert len(done) == 8, f"{8 - len(done)} requests of the silent worker never moved"
    programs = [sim_daemon.get(f"/v1/programs/p-slow-{i}").json() for i in range(8)]
    assert sum(p["requests"][0]["failovers"] for p in programs) == held


def test_requests_held_by_a_worker_that_never_answers_move_on(daemon_factory) -> None:  # type: ignore[no-untyped-def]
    """A worker that heartbeats but never answers and whose engine never steps: after the
    stall timeout (2 s here, 30 s by default) what it holds is aborted there and moves to
    the other worker; it is suspect (trace, /metrics) and healthy again after probation."""
    d: DaemonProcess = daemon_factory(
        workers=1, env={"AGENTD_REQUEST_STALL_TIMEOUT_S": "2"}).start()
    stuck = FakeWorker(d, "stuck-but-beating-0")
    try:
        done, threads = _spread(d, "p-held")
        _held_by(stuck, 8, done, within=10)
        _join(threads, 20)
        assert len(done) == 8, f"{8 - len(done)} requests still held after 20 s"
        held = {s.request_id for s in stuck.submits}
        assert eventually(lambda: set(stuck.aborts) == held, 5), (stuck.aborts, held)
        assert metric(d, "agentd_request_stalls_total", worker=stuck.worker_id) == len(held)
        programs = [d.get(f"/v1/programs/p-held-{i}").json() for i in range(8)]
        moved = [p for p in programs if p["requests"][0]["id"] in held]
        assert len(moved) == len(held)
        assert all(p["requests"][0]["failovers"] == 1 and p["worker_id"] == "local-sim-0"
                   for p in moved)
        trace = d.get(f"/v1/sessions/{moved[0]['session_id']}/trace").json()["data"]
        [failover] = [e for e in trace if e["kind"] == "request.failover"]
        assert "made no progress" in failover["data"]["reason"], failover
        # Probation over, it is back (and still not answering: the next stall would move
        # what it gets again, and keep it out twice as long).
        assert eventually(lambda: [w["status"] for w in d.get("/v1/workers").json()["data"]
                                   if w["id"] == stuck.worker_id] == ["healthy"])
    finally:
        stuck.close()
    assert eventually(lambda: worker_events(d, "worker.healthy")[-1:] == [stuck.worker_id])
    assert stuck.worker_id in worker_events(d, "worker.suspect")


def test_frames_about_another_workers_requests_are_ignored(daemon_factory) -> None:  # type: ignore[no-untyped-def]
    """A registered worker that sends deltas and a finish for a request running on the
    real worker changes nothing: the answer is the real worker's, token for token."""
    d: DaemonProcess = daemon_factory(workers=1, env={"AGENTD_SIM_TIME_SCALE": "3"}).start()
    rogue = FakeWorker(d, "rogue-0", kv_capacity_tokens=1)
    try:
        result: dict[str, Any] = {}
        thread = threading.Thread(target=lambda: result.update(r=chat(d, "p-victim", 200)))
        thread.start()
        deadline = time.time() + 10
        request_id = None
        while request_id is None and time.time() < deadline:
            reqs = d.get("/v1/programs/p-victim").json().get("requests") or []
            if reqs and reqs[0]["status"] == "running":
                request_id = reqs[0]["id"]
            time.sleep(0.05)
        assert request_id is not None
        for n in range(20):
            rogue.outbox.put(protocol.TokenDelta(request_id=request_id, text=f" forged{n}",
                                                 num_tokens=1))
        rogue.outbox.put(protocol.Finish(request_id=request_id, reason="stop", prompt_tokens=1,
                                         cached_tokens=0, output_tokens=1))
        thread.join(60)
        r = result["r"]
        assert r.status_code == 200, r.text
        text = r.json()["choices"][0]["message"]["content"]
        assert text.split() == [f"sim{i}" for i in range(200)]
        assert r.json()["usage"]["completion_tokens"] == 200
    finally:
        rogue.close()


def _nonsense(submit: protocol.Submit) -> list[protocol.WorkerMessage]:
    """Well-formed frames with values no engine sends."""
    return [protocol.TokenDelta(request_id=submit.request_id, text="x" * 2_000_000,
                                num_tokens=-5, prompt_tokens=-1, cached_tokens=-9),
            protocol.Finish(request_id=submit.request_id, reason="stop", prompt_tokens=-3,
                            cached_tokens=10**12, output_tokens=-7, ttft_s=-1.0)]


def _ask_liar(d: DaemonProcess) -> list[httpx.Response]:
    liar = FakeWorker(d, "liar-0", answer=_nonsense)
    try:
        answers = {f"p-liar-{n}": chat(d, f"p-liar-{n}") for n in range(6)}
        assert liar.submits, "nothing went to the lying worker: the test proved nothing"
        lied_to = {s.program_id for s in liar.submits}
        return [r for program, r in answers.items() if program in lied_to]
    finally:
        liar.close()


def test_nonsense_values_from_a_worker_do_not_break_the_daemon(sim_daemon: DaemonProcess) -> None:
    """Registration with zero sizes; negative token counts, a 2 MB delta and a finish that
    contradicts it: each request ends (an answer or a clear error), the daemon serves on."""
    FakeWorker(sim_daemon, "zero-0", kv_capacity_tokens=0, block_size=0, max_batch=0).close()
    for r in _ask_liar(sim_daemon):
        assert r.status_code in (200, 502), r.text
    assert serves(sim_daemon)
    assert sim_daemon.get("/healthz").json()["status"] == "ok"
    assert "Traceback" not in sim_daemon.log()


def test_usage_never_shows_impossible_counts(sim_daemon: DaemonProcess) -> None:
    """The liar's counts are clamped at the boundary: never negative, cached <= prompt,
    output <= max_tokens; the worker is logged once and counted every time."""
    lied_to = _ask_liar(sim_daemon)
    assert all(r.status_code == 200 for r in lied_to), [r.text[:200] for r in lied_to]
    for r in lied_to:
        usage = r.json()["usage"]
        counts = [v for v in usage.values() if isinstance(v, int)]
        assert min(counts) >= 0, usage
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
        assert cached <= usage["prompt_tokens"], usage
        assert usage["completion_tokens"] <= 4, usage
    # A delta and a finish per request, both impossible.
    assert metric(sim_daemon, "agentd_worker_bad_counts_total", worker="liar-0") == (
        2 * len(lied_to))
    assert sim_daemon.log_path is not None
    assert sim_daemon.log_path.read_text().count(
        "worker liar-0 sent impossible token counts") == 1


def test_an_oversized_frame_is_dropped(sim_daemon: DaemonProcess) -> None:
    sock = dealer(sim_daemon, "big")
    sock.send(b"\x85" + os.urandom(32 * 2**20))
    sock.send(msgspec.msgpack.encode({"type": "register", "worker_id": "big",
                                      "engine": "x" * 16 * 2**20}))
    time.sleep(0.5)
    assert serves(sim_daemon)
    assert "big" not in [w["id"] for w in sim_daemon.get("/v1/workers").json()["data"]]
    sock.close()
