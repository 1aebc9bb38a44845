"""A standby daemon (issue 27 item 4): two daemons on one PostgreSQL database, the second
started with --standby; one sim worker given both worker endpoints; clients with both
addresses through the SDK's failover (agentd/failover.py). kill -9 of the active daemon
under load: the standby takes the store's lease, recovers the durable state, binds and
serves within 10 s, the worker registers with it, and every request the active daemon
acknowledged is in the store, finished."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select

import agentd
from agentd import failover
from daemon.standby.run import EXIT_LEASE_LOST
from db.lease import LEASE_KEY
from db.models import Request
from tests.daemon_process import DaemonProcess, free_port
from tests.waiting import wait_for

MODEL = "sim-llama3-8b"
FAILOVER_LIMIT_S = 10.0
LOOPS = 3


def chat_body(program: str, session: str) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": "step"}],
            "max_tokens": 20, "program_id": program, "session_id": session}


class Loop:
    """One program's requests in a row through the SDK's failover over both daemons;
    records the request ids a daemon answered (acknowledged) and where."""

    def __init__(self, bases: str, token: str, n: int) -> None:
        self.daemons = failover.daemons(bases)
        self.headers = {"Authorization": f"Bearer {token}"}
        self.program, self.session = f"p-standby-{n}", f"s-standby-{n}"
        self.acked: list[tuple[str, str]] = []  # (request id, base that answered)
        self.last_base = ""
        self.errors: list[str] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def _post(self, base: str) -> httpx.Response:
        self.last_base = base
        return httpx.post(f"{base}/chat/completions", headers=self.headers,
                          json=chat_body(self.program, self.session), timeout=30)

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                r = self.daemons.send(self._post)
            except httpx.HTTPError as exc:  # sent, then the daemon died under it
                self.errors.append(f"{type(exc).__name__}: {exc}")
                continue
            if r.status_code == 200:
                self.acked.append((r.headers["x-request-id"], self.last_base))
            else:
                self.errors.append(f"{r.status_code}: {r.text[:200]}")


@pytest.fixture
def pair(tmp_path: Path, postgres_url: str) -> Iterator[tuple[DaemonProcess, DaemonProcess]]:
    """Daemon A (active) and B (standby) on one database, sharing a config dir (so one
    operator token and one worker key), each with its own TCP worker endpoint."""
    config_dir = tmp_path / "config"
    made: list[DaemonProcess] = []

    def daemon(name: str, *extra: str) -> DaemonProcess:
        d = DaemonProcess(data_dir=tmp_path / name, workers=0, db=postgres_url,
                          config_dir=config_dir, extra_args=list(extra),
                          env={"AGENTD_WORKER_BIND": f"tcp://127.0.0.1:{free_port()}",
                               "AGENTD_SIM_TIME_SCALE": "1"})
        made.append(d)
        return d

    a = daemon("a").start(wait_workers=0)
    b = daemon("b", "--standby").start(wait_workers=0)
    try:
        yield a, b
    finally:
        for d in made:
            d.stop()


@pytest.fixture
def worker_of_both(pair: tuple[DaemonProcess, DaemonProcess],
                   tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    a, b = pair
    connect = f"{a.env['AGENTD_WORKER_BIND']},{b.env['AGENTD_WORKER_BIND']}"
    assert a.config_dir is not None
    log = open(tmp_path / "worker.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [sys.executable, "-m", "daemon.commands.cli", "worker", "--engine", "sim",
         "--worker-id", "w-both", "--connect", connect,
         "--key-file", str(a.config_dir / "worker.key")],
        env=a.process_env(), stdout=log, stderr=subprocess.STDOUT)
    try:
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        log.close()


def healthz(d: DaemonProcess) -> tuple[int, dict[str, Any]]:
    try:
        r = httpx.get(f"{d.url}/healthz", timeout=2)
    except httpx.HTTPError:
        return 0, {}
    return r.status_code, r.json()


class Milestones:
    """When, after the kill, B's /healthz first answered 200 and first counted a worker
    (polled every 50 ms, for the printed breakdown)."""

    def __init__(self, d: DaemonProcess) -> None:
        self.d = d
        self.seen: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._t0 = 0.0

    def start(self, t0: float) -> None:
        self._t0 = t0
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set() and len(self.seen) < 2:
            code, body = healthz(self.d)
            now = time.monotonic() - self._t0
            if code == 200:
                self.seen.setdefault("serving", now)
                if body.get("workers_healthy", 0) >= 1:
                    self.seen.setdefault("worker", now)
            self._stop.wait(0.05)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def at(self, what: str) -> str:
        return f"{self.seen[what]:.2f} s" if what in self.seen else "not seen"


def _serving_workers(d: DaemonProcess) -> Callable[[], bool]:
    def check() -> bool:
        code, body = healthz(d)
        return code == 200 and body.get("workers_healthy", 0) >= 1
    return check


def test_the_standby_answers_503_and_a_second_active_is_refused(
        pair: tuple[DaemonProcess, DaemonProcess], tmp_path: Path) -> None:
    a, b = pair
    code, body = healthz(b)
    assert code == 503 and body["status"] == "standby", body
    r = httpx.post(f"{b.url}/v1/chat/completions", json=chat_body("p", "s"),
                   headers=b.auth_headers(), timeout=10)
    assert r.status_code == 503 and r.json()["error"]["code"] == "standby", r.text
    assert r.headers["retry-after"] == "2"
    # a third daemon on the database without --standby: one line, exit 1
    third = DaemonProcess(data_dir=tmp_path / "c", workers=0, db=a.db, config_dir=a.config_dir)
    done = subprocess.run(
        [sys.executable, "-m", "daemon.commands.cli", "start", "--port", str(third.port),
         "--data-dir", str(third.data_dir), "--workers", "0", "--db", a.db],
        env=third.process_env(), capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("agentd: another agentd holds this database's lease"), last
    assert "--standby" in last


def test_standby_without_postgresql_is_refused(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "daemon.commands.cli", "start", "--standby", "--port", "0",
         "--data-dir", str(tmp_path / "d")], capture_output=True, text=True, timeout=60,
        env={**os.environ, "AGENTD_CONFIG_DIR": str(tmp_path / "config")})
    assert done.returncode == 1
    assert done.stderr.strip() == (
        "agentd: --standby needs a PostgreSQL store (--db postgresql+asyncpg://...): an "
        "SQLite file has no lease another daemon could take over")


def test_kill_9_of_the_active_the_standby_serves_within_10_s(
        pair: tuple[DaemonProcess, DaemonProcess],
        worker_of_both: subprocess.Popen[bytes], monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = pair
    wait_for(_serving_workers(a), 30, lambda: f"the worker registered with A:\n{a.log()}")
    bases = f"{a.url}/v1,{b.url}/v1"
    loops = [Loop(bases, a.token, n) for n in range(LOOPS)]
    for loop in loops:
        loop.thread.start()
    wait_for(lambda: min(len(loop.acked) for loop in loops) >= 3, 30,
             "three answers to each loop from A", interval=0.05)

    watch = Milestones(b)
    a.kill()
    killed = time.monotonic()
    watch.start(killed)
    # the standby serves: a chat completion answered by B, through the SDK (agentd.llm,
    # AGENTD_URL listing both daemons), which retries past A's refused connections
    monkeypatch.setenv("AGENTD_URL", f"{a.url},{b.url}")
    monkeypatch.setenv("AGENTD_TOKEN", a.token)
    monkeypatch.setenv("AGENTD_MODEL", MODEL)
    with agentd.local_runtime():
        reply = agentd.llm([{"role": "user", "content": "are you there"}], max_tokens=3)
    failover_s = time.monotonic() - killed
    watch.stop()
    print(f"\nstandby failover: kill -9 of the active daemon -> first completion answered "
          f"by the standby: {failover_s:.2f} s (B's API up {watch.at('serving')}, "
          f"its first worker {watch.at('worker')})")
    assert reply
    assert failover_s < FAILOVER_LIMIT_S, failover_s
    code, body = healthz(b)
    assert code == 200 and body["workers_healthy"] >= 1, body

    # the loops go on, now answered by B
    counts = {loop.program: len(loop.acked) for loop in loops}
    wait_for(lambda: all(len(loop.acked) >= counts[loop.program] + 2 for loop in loops), 30,
             "two more answers to each loop, from B", interval=0.05)
    for loop in loops:
        loop.stop.set()
        loop.thread.join(35)
    for loop in loops:
        assert {base for _, base in loop.acked} == {f"{a.url}/v1", f"{b.url}/v1"}, loop.acked

    # nothing acknowledged is lost: every request A or B answered is in the store, finished
    acked = {rid for loop in loops for rid, _ in loop.acked}
    rows = {row.id: row.status for row in b.store_rows(
        select(Request.id, Request.status).where(Request.id.in_(acked)))}
    assert rows == dict.fromkeys(acked, "finished")
    # what was in flight at the kill is not left open: recovered as interrupted
    programs = [loop.program for loop in loops]
    open_ = b.store_rows(select(Request.id, Request.status).where(
        Request.program_id.in_(programs), Request.status.in_(("queued", "running"))))
    assert open_ == []
    interrupted = b.store_rows(select(Request.id, Request.error).where(
        Request.program_id.in_(programs), Request.status == "failed"))
    assert all(row.error == "interrupted by a daemon restart" for row in interrupted), interrupted
    for loop in loops:  # each program is B's now, with all its requests
        program = b.get(f"/v1/programs/{loop.program}").json()
        assert {rid for rid, _ in loop.acked} <= {r["id"] for r in program["requests"]}
    assert "took the store's lease" in b.log()
    assert a.proc is not None and a.proc.returncode == -signal.SIGKILL


def test_an_active_that_loses_its_lease_exits_and_the_standby_takes_over(
        pair: tuple[DaemonProcess, DaemonProcess]) -> None:
    """The lease's connection ends under the active daemon (here: the server ends that
    session, as a database restart or a cut network would): it exits at once with code 3,
    and the standby serves."""
    a, b = pair
    ended = _end_lease_session(a.db)
    assert ended == 1
    assert a.proc is not None
    code = wait_for(lambda: a.proc.poll() if a.proc and a.proc.poll() is not None else None,
                    15, lambda: f"A to exit after losing its lease:\n{a.log()}")
    assert code == EXIT_LEASE_LOST, a.log()
    assert "lost the store lease" in a.log()
    wait_for(lambda: healthz(b)[0] == 200, 15, lambda: f"B to serve:\n{b.log()}")


def _end_lease_session(url: str) -> int:
    """pg_terminate_backend on the session holding the daemon lease; how many it ended."""
    import psycopg

    with psycopg.connect(url.replace("postgresql+asyncpg://", "postgresql://"),
                         autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_locks WHERE locktype = 'advisory'"
            " AND granted AND ((classid::bigint << 32) | objid::bigint) = %s",
            (LEASE_KEY,)).fetchone()
    return int(row[0]) if row else 0
