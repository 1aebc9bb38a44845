"""Workers placed by Ray: a real daemon places sim workers as actors on a local
multi-node Ray cluster (ray.cluster_utils.Cluster: a head and three worker nodes, one CPU
each, so each node holds one worker); a node is removed under load, Ray restarts its worker
on the spare node, and every acknowledged request still finishes.

Without Ray the test skips, saying why, unless AGENTD_REQUIRE_RAY=1 (CI): then it fails.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.daemon_process import DaemonProcess, free_port
from tests.waiting import wait_for

MODEL = "sim-llama3-8b"
NODES = ("node-a", "node-b", "node-c")
WORKER_RESOURCE = "agentd-worker"  # only the worker nodes have it: nothing lands on the head


def _ray_missing(reason: str) -> None:
    if os.environ.get("AGENTD_REQUIRE_RAY") == "1":
        pytest.fail(f"AGENTD_REQUIRE_RAY=1 but {reason}", pytrace=False)
    pytest.skip(reason)


@contextlib.contextmanager
def local_cluster(**nodes: dict[str, Any]) -> Iterator[tuple[Any, dict[str, Any]]]:
    """A head without CPUs (nothing is placed there) and these named nodes."""
    try:
        from ray.cluster_utils import Cluster
    except ImportError:
        _ray_missing("ray is not installed (pip install -e '.[ray]')")
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 0, "node_name": "head", "include_dashboard": False})
    try:
        added = {name: cluster.add_node(node_name=name, **args) for name, args in nodes.items()}
        cluster.wait_for_nodes()
        yield cluster, added
    finally:
        cluster.shutdown()  # type: ignore[no-untyped-call]


@pytest.fixture
def ray_cluster() -> Iterator[tuple[Any, dict[str, Any]]]:
    with local_cluster(**{name: {"num_cpus": 1, "resources": {WORKER_RESOURCE: 1}}
                          for name in NODES}) as cluster:
        yield cluster


def _config(tmp_path: Path, address: str) -> Path:
    path = tmp_path / "agentd.toml"
    path.write_text(f"""
worker_bind = "tcp://127.0.0.1:{free_port()}"
sim_time_scale = 3.0

[placement]
backend = "ray"
address = "{address}"
num_cpus = 1
resources = {{ "{WORKER_RESOURCE}" = 1 }}
""")
    return path


def _workers(d: DaemonProcess) -> dict[str, dict[str, Any]]:
    return {w["id"]: w for w in d.get("/v1/workers").json()["data"]}


class Program(threading.Thread):
    """One program's requests in turn, streamed; what each acknowledged request got."""

    def __init__(self, client: openai.OpenAI, program_id: str, requests: int,
                 tokens: int) -> None:
        super().__init__(daemon=True)
        self.client, self.program_id = client, program_id
        self.requests, self.tokens = requests, tokens
        self.acknowledged = 0  # requests whose stream started
        self.finished: list[int] = []  # completion tokens of each finished request
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            for i in range(self.requests):
                stream = self.client.chat.completions.create(
                    model=MODEL, max_tokens=self.tokens, stream=True,
                    messages=[{"role": "user", "content": f"step {i} of {self.program_id}"}],
                    stream_options={"include_usage": True},
                    extra_body={"program_id": self.program_id, "session_id": "s-ray"})
                self.acknowledged += 1
                for chunk in stream:
                    if chunk.usage is not None:
                        self.finished.append(chunk.usage.completion_tokens)
        except BaseException as exc:  # reported by the test, with the program's name
            self.error = exc


def test_workers_move_to_another_node_when_theirs_is_lost(
        ray_cluster: tuple[Any, dict[str, Any]], daemon_factory: Callable[..., DaemonProcess],
        tmp_path: Path) -> None:
    cluster, nodes = ray_cluster
    d = daemon_factory(workers=2, extra_args=["--config", str(_config(tmp_path, cluster.address))])
    d.start(timeout=120)
    workers = _workers(d)
    assert set(workers) == {"ray-sim-0", "ray-sim-1"}
    assert {w["dp_rank"] for w in workers.values()} == {0, 1}
    placed = {w["id"]: w["node"] for w in workers.values()}
    assert set(placed.values()) < set(NODES) and len(set(placed.values())) == 2  # spread

    client = openai.OpenAI(base_url=f"{d.url}/v1", api_key=d.token, max_retries=0)
    programs = [Program(client, f"p-ray-{i}", requests=3, tokens=120) for i in range(4)]
    for program in programs:
        program.start()
    wait_for(lambda: all(p.acknowledged for p in programs) and any(
        w["inflight"] for w in _workers(d).values()), 60, "requests running on the workers")

    lost = placed["ray-sim-0"]
    removed_at = time.monotonic()
    cluster.remove_node(nodes[lost])
    [spare] = set(NODES) - set(placed.values())

    def moved() -> dict[str, Any] | None:
        w = _workers(d).get("ray-sim-0")
        return w if w and w["status"] == "healthy" and w["node"] == spare else None

    w0 = wait_for(moved, 60, lambda: f"ray-sim-0 back on {spare}: {_workers(d)}\n{d.log()}")
    print(f"node {lost} removed: ray-sim-0 serving again on {spare} after "
          f"{time.monotonic() - removed_at:.2f} s")
    assert w0["dp_rank"] == 0 and w0["node"] != lost  # same worker, same rank, new node
    for program in programs:
        program.join(120)
        assert not program.is_alive(), f"{program.program_id} did not finish"
        assert program.error is None, f"{program.program_id}: {program.error!r}"
        assert program.finished == [120, 120, 120], program.program_id
    trace = d.get("/v1/sessions/s-ray/trace", params={"limit": 5000}).json()["data"]
    assert any(e["kind"] == "request.failover" for e in trace)  # the lost node's requests
    for program in programs:
        assert d.post(f"/v1/programs/{program.program_id}/release").status_code == 200
        assert d.get(f"/v1/programs/{program.program_id}").json()["status"] == "STOPPED"
    events = d.get("/v1/events", params={"kind": "worker.placed,worker.moved"}).json()["data"]
    moves = [e for e in events if e["kind"] == "worker.moved"]
    assert moves and moves[-1]["data"]["node"] == spare, events


def test_a_daemon_replaces_an_earlier_daemons_worker_actor(
        ray_cluster: tuple[Any, dict[str, Any]], daemon_factory: Callable[..., DaemonProcess],
        tmp_path: Path) -> None:
    """An actor holding a worker's name, as an earlier daemon's worker actor does until Ray
    cleans up after that daemon (a standby takes over within seconds of a kill -9), is
    killed and the daemon's own worker placed under the name."""
    import ray

    from daemon.workers.ray_actor import RankHolder  # any actor class the nodes can import

    cluster, _ = ray_cluster
    ray.init(address=cluster.address, namespace="agentd", configure_logging=False)
    try:
        squatter: Any = ray.remote(RankHolder).options(
            name="ray-sim-0", lifetime="detached", num_cpus=0).remote()
        assert ray.get(squatter.gpus.remote(), timeout=60) == []
        d = daemon_factory(workers=1,
                           extra_args=["--config", str(_config(tmp_path, cluster.address))])
        d.start(timeout=120)
        assert "killing the leftover worker actor ray-sim-0" in d.log()
        assert _workers(d)["ray-sim-0"]["status"] == "healthy"
        client = openai.OpenAI(base_url=f"{d.url}/v1", api_key=d.token, max_retries=0)
        out = client.chat.completions.create(model=MODEL, max_tokens=4, messages=[
            {"role": "user", "content": "hello"}])
        assert out.usage is not None and out.usage.completion_tokens == 4
    finally:
        ray.shutdown()


def test_a_tensor_parallel_worker_gets_the_gpus_of_its_ranks_on_one_node() -> None:
    """Ray's test nodes declare GPUs they do not have: enough to place, not to run vLLM.
    A 2-way worker's ranks fit only on the two-GPU node; the worker's actor (bundle 0)
    sees both ranks' GPUs, which is what its vLLM worker is given (ray_actor.py)."""
    with local_cluster(**{"one-gpu": {"num_cpus": 2, "num_gpus": 1},
                          "two-gpus": {"num_cpus": 2, "num_gpus": 2}}) as (cluster, nodes):
        import ray

        from daemon.workers.placement_settings import PlacementSettings
        from daemon.workers.ray_actor import visible_gpus
        from daemon.workers.ray_placement import in_bundle, reserve_ranks

        ray.init(address=cluster.address, configure_logging=False)
        try:
            s = PlacementSettings(backend="ray", num_cpus=1, num_gpus=1, tensor_parallel_size=2)
            group, holders = reserve_ranks(s, "tp-worker")
            assert group.wait(60)
            table = ray.util.placement_group_table(group)
            assert table["strategy"] == "STRICT_PACK"
            assert set(table["bundles_to_node_id"].values()) == {nodes["two-gpus"].node_id}
            probe = ray.remote(visible_gpus).options(num_cpus=1, num_gpus=1,
                                                     scheduling_strategy=in_bundle(group, 0))
            gpus: list[str] = ray.get(probe.remote(holders), timeout=60)
            assert sorted(gpus) == ["0", "1"]
        finally:
            ray.shutdown()


def test_an_unreachable_cluster_fails_the_start_naming_the_address(tmp_path: Path) -> None:
    """ray.init would retry a dead address for ever; `agentd start` refuses at once instead."""
    try:
        import ray  # noqa: F401
    except ImportError:
        _ray_missing("ray is not installed (pip install -e '.[ray]')")
    dead = f"127.0.0.1:{free_port()}"  # nothing listens there
    out = subprocess.run(
        [sys.executable, "-m", "daemon.commands.cli", "start", "--port", "0", "--data-dir",
         str(tmp_path / "data"), "--config", str(_config(tmp_path, dead))],
        env={**os.environ, "AGENTD_CONFIG_DIR": str(tmp_path / "config")},
        capture_output=True, text=True, timeout=120)
    # One readable line and exit 1, before anything starts: no traceback.
    assert out.returncode == 1, out.stderr
    assert "Traceback" not in out.stderr, out.stderr
    assert f"placement.address {dead}: no Ray cluster answers there" in out.stderr
