"""Start and stop a real `agentd start` process for integration tests."""

from __future__ import annotations

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

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, wait_workers: int | None = None, timeout: float = 60.0) -> DaemonProcess:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = self.data_dir / f"daemon-{int(time.time() * 1000)}.log"
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "AGENTD_HEARTBEAT_INTERVAL_S": "0.2",
               "AGENTD_HEARTBEAT_TIMEOUT_S": "1.5", **self.env}
        cmd = [sys.executable, "-m", "daemon.cli", "start", "--port", str(self.port),
               "--data-dir", str(self.data_dir), "--workers", str(self.workers),
               "--engine", self.engine, *self.extra_args]
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                         start_new_session=True)
        self.wait_ready(self.workers if wait_workers is None else wait_workers, timeout)
        return self

    def wait_ready(self, workers: int, timeout: float) -> None:
        deadline = time.time() + timeout
        last: Any = None
        while time.time() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"agentd exited with {self.proc.returncode}:\n{self.log()}")
            try:
                last = httpx.get(f"{self.url}/healthz", timeout=1).json()
                if last.get("workers_healthy", 0) >= workers:
                    return
            except httpx.HTTPError as exc:
                last = exc
            time.sleep(0.1)
        raise TimeoutError(f"agentd not ready after {timeout}s ({last}):\n{self.log()}")

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
        """SIGKILL the daemon only, like a crash; its workers stay until reaped."""
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(5)

    def _reap_group(self) -> None:
        assert self.proc is not None
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def get(self, path: str, **kw: Any) -> httpx.Response:
        return httpx.get(f"{self.url}{path}", timeout=10, **kw)

    def post(self, path: str, **kw: Any) -> httpx.Response:
        return httpx.post(f"{self.url}{path}", timeout=30, **kw)
