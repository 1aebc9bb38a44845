"""Start and stop a real `agentd start` process for integration tests."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import Executable, Row, create_engine
from sqlalchemy.pool import NullPool

from db.engine import sqlite_url, sync_url
from tests.waiting import wait_for


def _die_with_parent() -> None:
    """SIGTERM the daemon if the test process dies first (killed by a timeout, say):
    a clean stop that also stops its workers, so no test leaves a daemon behind."""
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class DaemonProcess:
    data_dir: Path
    port: int = field(default_factory=free_port)
    workers: int = 1
    engine: str = "sim"
    env: dict[str, str] = field(default_factory=dict)
    extra_args: list[str] = field(default_factory=list)
    proc: subprocess.Popen[bytes] | None = None
    log_path: Path | None = None
    # Where the daemon writes its first-start operator token (AGENTD_CONFIG_DIR), so
    # tests never touch the real home; defaults to <data_dir>/config.
    config_dir: Path | None = None
    # The store's SQLAlchemy URL (`--db`); empty: the SQLite file in the data dir.
    db: str = ""

    def __post_init__(self) -> None:
        if self.config_dir is not None:
            return
        if self.env.get("AGENTD_CONFIG_DIR"):
            self.config_dir = Path(self.env["AGENTD_CONFIG_DIR"])
        elif "AGENTD_CONFIG_DIR" in self.env:
            # Set but empty: the daemon falls back to the XDG config dir, as for users.
            xdg = self.env.get("XDG_CONFIG_HOME") or os.environ.get("XDG_CONFIG_HOME")
            self.config_dir = Path(xdg or Path.home() / ".config") / "agentd"
        else:
            self.config_dir = self.data_dir / "config"

    @property
    def token_path(self) -> Path:
        assert self.config_dir is not None
        return self.config_dir / "token"

    @property
    def token(self) -> str:
        """The operator token the daemon wrote on its first start."""
        return self.token_path.read_text().strip()

    def auth_headers(self, token: str | None = None) -> dict[str, str]:
        if token is None and not self.token_path.exists():
            return {}  # a daemon started with auth off writes no token
        return {"Authorization": f"Bearer {token or self.token}"}

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def db_url(self) -> str:
        return self.db or sqlite_url(self.data_dir / "agentd.db")

    def db_args(self) -> list[str]:
        return ["--db", self.db] if self.db else []

    def store_rows(self, query: Executable) -> list[Row[Any]]:
        """The rows `query` reads from the daemon's store (running or not), with the sync
        driver; JSON columns come back parsed on either database."""
        engine = create_engine(sync_url(self.db_url), poolclass=NullPool)
        try:
            with engine.connect() as conn:
                return list(conn.execute(query).all())
        finally:
            engine.dispose()

    def start(self, wait_workers: int | None = None, timeout: float = 60.0) -> DaemonProcess:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = self.data_dir / f"daemon-{int(time.time() * 1000)}.log"
        env = self.process_env()
        cmd = [sys.executable, "-m", "daemon.commands.cli", "start", "--port", str(self.port),
               "--data-dir", str(self.data_dir), "--workers", str(self.workers),
               "--engine", self.engine, *self.db_args(), *self.extra_args]
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                         start_new_session=True, preexec_fn=_die_with_parent)
        self.wait_ready(self.workers if wait_workers is None else wait_workers, timeout)
        return self

    def process_env(self) -> dict[str, str]:
        return {**os.environ, "PYTHONUNBUFFERED": "1", "AGENTD_HEARTBEAT_INTERVAL_S": "0.2",
                "AGENTD_HEARTBEAT_TIMEOUT_S": "1.5", "AGENTD_CONFIG_DIR": str(self.config_dir),
                **self.env}

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        """Run `agentd ARGS --data-dir <this daemon's>` (e.g. `token create ...`); the
        token commands also get its `--db`."""
        db = self.db_args() if args[:1] == ("token",) else []
        cmd = [sys.executable, "-m", "daemon.commands.cli", *args, "--data-dir", str(self.data_dir),
               *db]
        return subprocess.run(cmd, env=self.process_env(), capture_output=True, text=True,
                              timeout=60)

    def wait_ready(self, workers: int, timeout: float) -> None:
        last: Any = None

        def ready() -> bool:
            nonlocal last
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"agentd exited with {self.proc.returncode}:\n{self.log()}")
            try:
                last = httpx.get(f"{self.url}/healthz", timeout=1).json()
            except httpx.HTTPError as exc:
                last = exc
                return False
            return bool(last.get("workers_healthy", 0) >= workers)

        wait_for(ready, timeout, lambda: f"agentd ready with {workers} worker(s) ({last}):\n"
                                         f"{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-6000:] if self.log_path else ""

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 20.0) -> int | None:
        if self.proc is None or self.proc.poll() is not None:
            return None if self.proc is None else self.proc.returncode
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            return self.proc.wait(5)
        finally:
            self._reap_group()

    def kill(self) -> None:
        """SIGKILL the daemon only, like a crash; its local workers exit on their own (the
        parent-death signal), anything else it started stays until reaped."""
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(5)

    def _reap_group(self) -> None:
        assert self.proc is not None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)

    def get(self, path: str, token: str | None = None, **kw: Any) -> httpx.Response:
        """GET with the operator token (or `token`); headers= adds to or overrides it."""
        kw["headers"] = {**self.auth_headers(token), **kw.get("headers", {})}
        return httpx.get(f"{self.url}{path}", timeout=10, **kw)

    def post(self, path: str, token: str | None = None, **kw: Any) -> httpx.Response:
        kw["headers"] = {**self.auth_headers(token), **kw.get("headers", {})}
        return httpx.post(f"{self.url}{path}", timeout=30, **kw)

    def run_ended(self, run_id: str, timeout: float = 60.0) -> dict[str, Any]:
        """The run's view once it has finished, failed or been cancelled."""
        def ended() -> dict[str, Any] | None:
            view: dict[str, Any] = self.get(f"/v1/runs/{run_id}").json()
            return view if view["status"] in ("finished", "failed", "cancelled") else None

        return dict(wait_for(ended, timeout, lambda: (
            f"run {run_id} to end: {self.get(f'/v1/runs/{run_id}').json()}\n{self.log()}")))

    def run_to_end(self, body: dict[str, Any], timeout: float = 30.0) -> dict[str, Any]:
        """Start a run (`POST /v1/runs` with `body`) and return its view once it has ended."""
        r = self.post("/v1/runs", json=body)
        assert r.status_code == 201, r.text
        return self.run_ended(r.json()["id"], timeout)

    def decide(self, run_id: str, *decisions: dict[str, Any]) -> list[dict[str, Any]]:
        """Send control decisions for a run as the operator; one result per decision."""
        r = self.post(f"/v1/runs/{run_id}/control/decisions",
                      json={"decisions": list(decisions)})
        assert r.status_code == 200, r.text
        return list(r.json()["results"])
