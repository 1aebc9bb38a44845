"""A real Docker engine for tests: used when reachable, otherwise started once per session
(as root, via scripts/start-dockerd.sh) and stopped afterwards.

Without an engine the docker tests skip, saying why, unless AGENTD_REQUIRE_DOCKER=1 (CI),
where a missing engine is a failure: a green run must not hide untested containers.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn

import docker
import pytest

from tests.waiting import wait_for_exit

REPO = Path(__file__).resolve().parents[1]
BUSYBOX_IMAGE = "agentd-busybox:latest"


def _unavailable(reason: str) -> NoReturn:
    if os.environ.get("AGENTD_REQUIRE_DOCKER") == "1":
        pytest.fail(f"AGENTD_REQUIRE_DOCKER=1 but {reason}")
    pytest.skip(reason)


def _reachable() -> bool:
    try:
        client = docker.from_env(timeout=5)
        client.ping()
        client.close()
    except Exception:
        return False
    return True


def _start(run_dir: str) -> dict[str, str]:
    proc = subprocess.run(
        [str(REPO / "scripts" / "start-dockerd.sh"), run_dir],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if proc.returncode != 0:
        _unavailable(f"could not start dockerd: {proc.stderr.strip()[-500:]}")
    exports = (line.removeprefix("export ").split("=", 1) for line in proc.stdout.splitlines())
    return {k: v for k, v in exports}


def _stop(pidfile: str) -> None:
    try:
        pid = int(Path(pidfile).read_text())
        os.kill(pid, signal.SIGTERM)
    except (OSError, ValueError):
        return
    with contextlib.suppress(AssertionError):  # still there: the session ends anyway
        wait_for_exit(pid, 20, "dockerd to stop")


@pytest.fixture(scope="session")
def docker_host() -> Iterator[str]:
    """DOCKER_HOST of a live engine (also set in os.environ for the SDK's from_env)."""
    if _reachable():
        yield os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
        return
    if os.geteuid() != 0:
        _unavailable("no Docker engine reachable via DOCKER_HOST, and not root to start one")
    # Short path: a unix socket path must stay under ~108 bytes.
    run_dir = tempfile.mkdtemp(prefix="agentd-dockerd-", dir="/tmp")
    previous = os.environ.get("DOCKER_HOST")
    exports = _start(run_dir)
    os.environ["DOCKER_HOST"] = exports["DOCKER_HOST"]
    try:
        yield exports["DOCKER_HOST"]
    finally:
        _stop(exports["AGENTD_DOCKERD_PIDFILE"])
        if previous is None:
            os.environ.pop("DOCKER_HOST", None)
        else:
            os.environ["DOCKER_HOST"] = previous
        shutil.rmtree(run_dir, ignore_errors=True)


@pytest.fixture(scope="session")
def busybox_image(docker_host: str) -> str:
    """A 2 MB busybox image built locally (no registry is needed)."""
    proc = subprocess.run(
        [str(REPO / "scripts" / "make-busybox-image.sh"), BUSYBOX_IMAGE],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=os.environ | {"DOCKER_HOST": docker_host},
    )
    if proc.returncode != 0:
        _unavailable(f"could not build {BUSYBOX_IMAGE}: {proc.stderr.strip()[-500:]}")
    return BUSYBOX_IMAGE


@pytest.fixture(scope="session")
def docker_client(docker_host: str) -> Iterator[docker.DockerClient]:
    client = docker.DockerClient(base_url=docker_host)
    yield client
    client.close()


class SecondEngine:
    """A second Docker engine of its own (socket, data root, exec root, pidfile under `dir`),
    as a remote tool host stands in for; it can be stopped and started again mid-test, its
    images and containers kept across."""

    def __init__(self, run_dir: str) -> None:
        self.dir = run_dir
        self.host = f"unix://{run_dir}/docker.sock"

    def start(self) -> None:
        exports = _start(self.dir)
        assert exports["DOCKER_HOST"] == self.host, exports

    def stop(self) -> None:
        _stop(f"{self.dir}/dockerd.pid")

    def client(self) -> docker.DockerClient:
        return docker.DockerClient(base_url=self.host, timeout=60)


@pytest.fixture(scope="session")
def second_docker_engine(busybox_image: str) -> Iterator[SecondEngine]:
    """Another engine beside `docker_host`, always started here (as root) with the busybox
    image; stopped and removed at the end of the session."""
    if os.geteuid() != 0:
        _unavailable("a second Docker engine needs root to start")
    # CI starts it up front (AGENTD_SECOND_DOCKERD_DIR, scripts/start-dockerd.sh's DIR) and
    # stops it itself; otherwise it is this session's.
    given = os.environ.get("AGENTD_SECOND_DOCKERD_DIR")
    engine = SecondEngine(given or tempfile.mkdtemp(prefix="agentd-dockerd-b-", dir="/tmp"))
    try:
        engine.start()
        proc = subprocess.run(
            [str(REPO / "scripts" / "make-busybox-image.sh"), busybox_image],
            capture_output=True, text=True, timeout=120, check=False,
            env=os.environ | {"DOCKER_HOST": engine.host})
        if proc.returncode != 0:
            _unavailable(f"could not build {busybox_image} on the second engine: "
                         f"{proc.stderr.strip()[-500:]}")
        yield engine
    finally:
        if not given:
            engine.stop()
            shutil.rmtree(engine.dir, ignore_errors=True)
