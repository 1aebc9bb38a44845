"""A worker's identity beyond its id: the node it runs on and its data-parallel rank, as
`agentd worker --connect tcp://…` started by hand registers them and /v1/workers shows them."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Callable, Iterator

import pytest

from tests.daemon_process import DaemonProcess, free_port
from tests.ui.webui_support import login


@pytest.fixture
def tcp_daemon(daemon_factory: Callable[..., DaemonProcess]) -> DaemonProcess:
    return daemon_factory(
        workers=0, env={"AGENTD_WORKER_BIND": f"tcp://127.0.0.1:{free_port()}"}).start(
        wait_workers=0)


def worker_cmd(d: DaemonProcess, worker_id: str, *extra: str) -> list[str]:
    assert d.config_dir is not None
    return [sys.executable, "-m", "daemon.commands.cli", "worker", "--engine", "sim",
            "--worker-id", worker_id, "--connect", d.env["AGENTD_WORKER_BIND"],
            "--key-file", str(d.config_dir / "worker.key"), *extra]


@pytest.fixture
def hand_workers(tcp_daemon: DaemonProcess) -> Iterator[list[subprocess.Popen[bytes]]]:
    d = tcp_daemon
    procs = [subprocess.Popen(worker_cmd(d, "named", "--node", "gpu-7", "--dp-rank", "3"),
                              env=d.process_env(), stdout=subprocess.DEVNULL),
             subprocess.Popen(worker_cmd(d, "plain"), env=d.process_env(),
                              stdout=subprocess.DEVNULL)]
    yield procs
    for proc in procs:
        proc.terminate()
        proc.wait(20)


def test_hand_started_workers_register_their_node_and_rank(
        tcp_daemon: DaemonProcess, hand_workers: list[subprocess.Popen[bytes]]) -> None:
    d = tcp_daemon
    d.wait_ready(2, 60)
    workers = {w["id"]: w for w in d.get("/v1/workers").json()["data"]}
    assert (workers["named"]["node"], workers["named"]["dp_rank"]) == ("gpu-7", 3)
    # without --node: the host name, and no rank
    assert (workers["plain"]["node"], workers["plain"]["dp_rank"]) == (socket.gethostname(), None)
    body = {"model": "sim-llama3-8b", "max_tokens": 4,
            "messages": [{"role": "user", "content": "hi"}]}
    for _ in range(4):
        assert d.post("/v1/chat/completions", json=body).status_code == 200
    ui = login(d)
    page = ui.get("/ui/worker", params={"id": "named"})
    assert page.status_code == 200
    assert "gpu-7 · data-parallel rank 3" in page.text
    assert "gpu-7 <small>rank 3</small>" in ui.get("/ui/").text
    ui.close()


def test_a_negative_rank_is_refused_with_one_line(tcp_daemon: DaemonProcess) -> None:
    out = subprocess.run(worker_cmd(tcp_daemon, "bad", "--dp-rank", "-1"),
                         env=tcp_daemon.process_env(), capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 2
    assert "--dp-rank: must be >= 0, got -1" in out.stderr.strip().splitlines()[-1]
    assert tcp_daemon.get("/v1/workers").json()["data"] == []


def test_a_sim_worker_refuses_tensor_parallelism_with_one_line(tcp_daemon: DaemonProcess) -> None:
    out = subprocess.run(worker_cmd(tcp_daemon, "tp", "--tensor-parallel-size", "2"),
                         env=tcp_daemon.process_env(), capture_output=True, text=True,
                         timeout=60)
    assert out.returncode != 0
    assert "the sim engine models one rank" in out.stderr.strip().splitlines()[-1]
