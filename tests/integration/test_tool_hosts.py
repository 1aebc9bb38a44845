"""Remote tool hosts: one tool pool over two real Docker engines (two dockerd processes with
their own sockets and data roots on this machine). Placement by load, a program kept on one
host, reclamation on each host (release, gc, orphans after a SIGKILL), and one host down not
stopping the other."""

from __future__ import annotations

import asyncio
import os
import sqlite3
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import docker
import openai
import pytest

from tests.daemon_process import DaemonProcess
from tests.docker_fixtures import SecondEngine
from tests.tool_cleanup import remove_daemon_tools
from tests.waiting import wait_for
from tools import DockerHosts, reclaim
from tools.base import Owner
from tools.docker_backend import KEEPALIVE
from tools.spec import parse_spec

POOL_LABEL = "agentd.tool_pool"


@pytest.fixture
def engines(docker_host: str, docker_client: docker.DockerClient,
            second_docker_engine: SecondEngine) -> Iterator[dict[str, docker.DockerClient]]:
    """Clients of both engines by URL; the second one running at the start and the end."""
    second_docker_engine.start()
    other = second_docker_engine.client()
    yield {docker_host: docker_client, second_docker_engine.host: other}
    second_docker_engine.start()  # a test that stopped it leaves it as it found it
    other.close()


def _daemon(factory: Callable[..., DaemonProcess], tmp_path: Path, hosts: list[str],
            image: str) -> DaemonProcess:
    cfg = tmp_path / "agentd.toml"
    urls = ", ".join(f'"{h}"' for h in hosts)
    cfg.write_text(f'[tool_pools.default]\nhosts = [{urls}]\n'
                   f'[tools.box]\nimage = "{image}"\nmounts = [{{target = "/data"}}]\n'
                   f'[tools.box2]\nimage = "{image}"\n')
    return factory(workers=1, extra_args=["--config", str(cfg)]).start()


def _use(d: DaemonProcess, program: str, tool: str = "box") -> None:
    client = openai.OpenAI(base_url=f"{d.url}/v1", api_key=d.token, max_retries=0)
    client.chat.completions.create(model="sim-llama3-8b", max_tokens=2,
                                   messages=[{"role": "user", "content": "go"}],
                                   extra_body={"program_id": program})
    r = d.post(f"/v1/programs/{program}/tools/{tool}/exec", json={"command": "echo x > /tmp/f"})
    assert r.status_code == 200 and r.json()["exit_code"] == 0, r.text


def _placed(engines: dict[str, docker.DockerClient], daemon_id: str) -> dict[str, list[str]]:
    """Program ids of the daemon's containers on each engine, checking each one's host label."""
    found = {}
    for host, client in engines.items():
        # The engine's listing alone: no inspect per container, which a container being
        # removed meanwhile would fail.
        labels = [c["Labels"] for c in client.api.containers(
            all=True, filters={"label": [f"agentd.daemon_id={daemon_id}"]})]
        assert all(one["agentd.tool_host"] == host for one in labels)
        found[host] = sorted(one["agentd.program_id"] for one in labels)
    return found


def _load(client: docker.DockerClient, image: str, n: int) -> list[str]:
    """`n` live containers of the pool from some other daemon: load on that engine."""
    labels = {"agentd.daemon_id": "other-daemon", "agentd.program_id": "x", POOL_LABEL: "default"}
    return [str(client.containers.run(image, KEEPALIVE, detach=True, network_mode="none",
                                      labels=labels).id) for _ in range(n)]


def _orphan(client: docker.DockerClient, image: str, daemon_id: str, program: str) -> str:
    labels = {"agentd.daemon_id": daemon_id, "agentd.program_id": program,
              "agentd.tool": "box", POOL_LABEL: "default"}
    return str(client.containers.run(image, KEEPALIVE, detach=True, network_mode="none",
                                     labels=labels).id)


def _host_up(d: DaemonProcess, host: str) -> float | None:
    for line in d.get("/metrics").text.splitlines():
        if line.startswith(f'agentd_tool_host_up{{host="{host}"}} '):
            return float(line.rsplit(" ", 1)[1])
    return None


def _cleanup(engines: dict[str, docker.DockerClient], d: DaemonProcess) -> None:
    remove_daemon_tools(d.data_dir)
    for client in engines.values():
        for label in ("agentd.daemon_id=other-daemon",
                      f"agentd.daemon_id={(d.data_dir / 'daemon_id').read_text().strip()}"):
            for c in client.containers.list(all=True, filters={"label": [label]}):
                c.remove(force=True, v=True)
            for v in client.volumes.list(filters={"label": [label]}):
                v.remove(force=True)


def test_placement_by_load_release_and_orphans_on_both_hosts(
    daemon_factory: Callable[..., DaemonProcess], tmp_path: Path, busybox_image: str,
    engines: dict[str, docker.DockerClient],
) -> None:
    a, b = list(engines)
    _load(engines[a], busybox_image, 2)  # A starts with two live containers of the pool
    d = _daemon(daemon_factory, tmp_path, [a, b], busybox_image)
    try:
        daemon_id = (d.data_dir / "daemon_id").read_text().strip()
        # Loads (A, B) before each: (2, 0) -> B, (2, 1) -> B, (2, 2) -> A (the first on a
        # tie), (3, 2) -> B.
        for program in ("p1", "p2", "p3", "p4"):
            _use(d, program)
        _use(d, "p1", "box2")  # a program's second tool joins its first, on B
        assert _placed(engines, daemon_id) == {a: ["p3"], b: ["p1", "p1", "p2", "p4"]}
        rows = d.get("/v1/tools").json()["data"]
        assert {(r["program_id"], r["host"]) for r in rows if r["resource"] == "container"} == {
            ("p1", b), ("p2", b), ("p3", a), ("p4", b)}
        # A request's spec naming a pool that is not configured: a 400 naming the field.
        r = d.post("/v1/programs/p2/tools/adhoc/exec", json={
            "command": "true", "spec": {"image": busybox_image, "pool": "nope"}})
        assert r.status_code == 400 and "pool: no tool pool named 'nope'" in r.text, r.text

        # Released: reclaimed on its host (p1's two containers and its volume on B).
        assert d.post("/v1/programs/p1/release").status_code == 200
        wait_for(lambda: _placed(engines, daemon_id) == {a: ["p3"], b: ["p2", "p4"]}, 30,
                 lambda: f"p1 reclaimed on B: {_placed(engines, daemon_id)}")

        # A crash: nothing is released; p3 (on A) and p4 (on B) end while it is down.
        d.kill()
        d._reap_group()
        with sqlite3.connect(d.data_dir / "agentd.db") as con:
            con.execute("UPDATE programs SET status='STOPPED' WHERE id IN ('p3', 'p4')")
        d.start()
        assert _placed(engines, daemon_id) == {a: [], b: ["p2"]}  # reclaimed at start

        # gc while running: an orphan on each host goes, each where it is.
        lost = {host: _orphan(client, busybox_image, daemon_id, "p-lost")
                for host, client in engines.items()}
        answer = d.post("/v1/tools/gc", json={"dry_run": False}).json()
        assert sorted((r["host"], r["id"]) for r in answer["data"]) == sorted(
            (host, cid) for host, cid in lost.items())
        assert answer["hosts_down"] == {}
        assert _placed(engines, daemon_id) == {a: [], b: ["p2"]}
    finally:
        d.stop()
        _cleanup(engines, d)


def test_one_host_down_does_not_stop_the_other(
    daemon_factory: Callable[..., DaemonProcess], tmp_path: Path, busybox_image: str,
    engines: dict[str, docker.DockerClient], second_docker_engine: SecondEngine,
) -> None:
    a, b = list(engines)
    # The daemon's id is its data dir's; known before it starts, so B can hold an orphan of it.
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "daemon_id").write_text("agentd-hosttest01\n")
    orphan_b = _orphan(engines[b], busybox_image, "agentd-hosttest01", "p-gone-b")
    second_docker_engine.stop()

    d = _daemon(daemon_factory, tmp_path, [a, b], busybox_image)  # degraded: B is down
    try:
        assert f"Docker engine {b} does not answer" in d.log()
        for program in ("p1", "p2"):  # A holds the only reachable load: both go there
            _use(d, program)
        assert _placed({a: engines[a]}, "agentd-hosttest01") == {a: ["p1", "p2"]}

        # gc reclaims on A and reports B, instead of failing.
        orphan_a = _orphan(engines[a], busybox_image, "agentd-hosttest01", "p-gone-a")
        answer = d.post("/v1/tools/gc", json={"dry_run": False}).json()
        assert [r["id"] for r in answer["data"]] == [orphan_a]
        assert list(answer["hosts_down"]) == [b]
        ctl = subprocess.run([sys.executable, "-m", "console.agentctl", "tools", "gc", "--dry-run"],
                             env={**os.environ, "AGENTD_URL": d.url, "AGENTD_TOKEN": d.token},
                             capture_output=True, text=True, timeout=60)
        assert ctl.returncode == 0 and f"skipped Docker engine {b} (does not answer" in ctl.stdout
        errors = [r for r in d.get("/v1/tools").json()["data"] if r["resource"] == "error"]
        assert [(r["host"], r["error"]["reason"]) for r in errors] == [(b, "engine_down")]
        # /metrics reports a listing at most USAGE_MAX_AGE_S old: wait for one that saw B.
        wait_for(lambda: _host_up(d, b) == 0.0 and _host_up(d, a) == 1.0, 30,
                 lambda: f"agentd_tool_host_up 0 for B, 1 for A: {_host_up(d, b)}")

        # B is back: the next gc reaches it and reclaims what it held.
        second_docker_engine.start()
        answer = d.post("/v1/tools/gc", json={"dry_run": False}).json()
        assert [(r["host"], r["id"]) for r in answer["data"]] == [(b, orphan_b)]
        assert answer["hosts_down"] == {}
        _use(d, "p3")  # loads (2, 0): the first program after B's return goes to B
        assert _placed(engines, "agentd-hosttest01") == {a: ["p1", "p2"], b: ["p3"]}
        wait_for(lambda: _host_up(d, b) == 1.0, 30, "agentd_tool_host_up 1 for B again")
    finally:
        d.stop()
        _cleanup(engines, d)


async def test_concurrent_placements_count_creations_in_flight(
    busybox_image: str, engines: dict[str, docker.DockerClient],
) -> None:
    """Programs prepared at the same moment see the same engine counts; the creations in
    flight split them. Two tools of one program prepared at once still share an engine."""
    a, b = list(engines)
    me = f"place-{uuid.uuid4().hex[:6]}"
    # A pool of its own: load counts every live container of the pool on an engine, and
    # the engines' "default" pool may still hold other tests' containers (the fresh-clone
    # run found both creations on the emptier engine).
    pool = me.replace("-", "")
    hosts = DockerHosts({pool: [a, b]})
    spec = parse_spec({"name": "sh", "image": busybox_image, "pool": pool})
    other = parse_spec({"name": "sh2", "image": busybox_image, "pool": pool})
    try:
        envs = await asyncio.gather(hosts.create(Owner(me, "q1", "sh"), spec),
                                    hosts.create(Owner(me, "q2", "sh"), spec))
        assert sorted(e.host for e in envs) == sorted([a, b])
        pair = await asyncio.gather(hosts.create(Owner(me, "q3", "sh"), spec),
                                    hosts.create(Owner(me, "q3", "sh2"), other))
        assert pair[0].host == pair[1].host
        for env in [*envs, *pair]:  # each one runs where its label says, and answers there
            assert engines[env.host].containers.get(env.id).labels["agentd.tool_host"] == env.host
            assert (await hosts.exec(env, ["echo", env.owner.program_id], 30)).stdout == \
                f"{env.owner.program_id}\n"
    finally:
        await reclaim.reconcile(me, [hosts], lambda: ())
    assert await hosts.resources(me) == []
