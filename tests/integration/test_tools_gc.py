"""Reconciliation against real resources: orphans of this daemon go, the rest stays."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path

import docker
import openai
import pytest

from tests.daemon_process import DaemonProcess
from tests.tool_cleanup import remove_daemon_tools
from tests.waiting import wait_for
from tools import reclaim
from tools.base import Backend, Owner
from tools.docker_backend import DockerBackend
from tools.process_backend import ProcessBackend
from tools.spec import parse_spec


@pytest.fixture(params=["docker", "process"])
def backend_and_spec(
    request: pytest.FixtureRequest, tmp_path: Path
) -> tuple[Backend, dict[str, str]]:
    if request.param == "docker":
        image = request.getfixturevalue("busybox_image")
        return DockerBackend(), {"name": "sh", "image": image}
    return ProcessBackend(tmp_path / "t"), {"name": "sh", "backend": "process"}


async def test_reconcile_reclaims_only_this_daemons_orphans(
    backend_and_spec: tuple[Backend, dict[str, str]],
) -> None:
    backend, raw = backend_and_spec
    spec = parse_spec(raw | ({"mounts": [{"target": "/data"}]} if "image" in raw else {}))
    me, other = f"gc-{uuid.uuid4().hex[:6]}", f"gc-{uuid.uuid4().hex[:6]}"
    for owner in (
        Owner(me, "live", "sh"),
        Owner(me, "stopped", "sh"),
        Owner(me, "unknown", "sh"),
        Owner(other, "stopped", "sh"),
    ):
        await backend.create(owner, spec)

    async def live_programs() -> set[str]:  # the daemon's store answers asynchronously
        return {"live"}

    try:
        planned = await reclaim.reconcile(me, [backend], live_programs, dry_run=True)
        assert {r["program_id"] for r in planned} == {"stopped", "unknown"}
        kept = {r.owner.program_id for r in await backend.resources(me)}
        assert kept == {"live", "stopped", "unknown"}  # a dry run removes nothing

        events: list[dict[str, object]] = []
        done = await reclaim.reconcile(me, [backend], live_programs, on_event=events.append)
        assert sorted((d["program_id"], d["resource"]) for d in done) == sorted(
            (d["program_id"], d["resource"]) for d in planned
        )
        assert all(d["ok"] for d in done) and len(events) == len(done)
        assert {r.owner.program_id for r in await backend.resources(me)} == {"live"}
        assert {r.owner.program_id for r in await backend.resources(other)} == {"stopped"}
    finally:
        for daemon_id in (me, other):
            await reclaim.reconcile(daemon_id, [backend], lambda: ())
    assert await backend.resources(me) == [] and await backend.resources(other) == []


def _orphan(client: docker.DockerClient, image: str, daemon_id: str, program: str) -> str:
    """A container as a crashed daemon run leaves it: labelled, running, owned by nobody live."""
    owner = Owner(daemon_id, program, "box")
    container = client.containers.run(image, ["sleep", "3600"], detach=True,
                                      labels=owner.labels(), network_mode="none")
    return str(container.id)


def _exists(client: docker.DockerClient, container_id: str) -> bool:
    try:
        client.containers.get(container_id)
    except docker.errors.NotFound:
        return False
    return True


def _releases(d: DaemonProcess, session: str) -> int:
    events = d.get(f"/v1/sessions/{session}/trace").json()["data"]
    return sum(e["kind"] == "tool.release" and e["data"]["why"] == "gc" for e in events)


def test_daemon_reclaims_orphans_after_sigkill_and_on_gc(
    daemon_factory: Callable[..., DaemonProcess], tmp_path: Path, busybox_image: str,
    docker_client: docker.DockerClient,
) -> None:
    cfg = tmp_path / "agentd.toml"
    cfg.write_text(f'[tools.box]\nimage = "{busybox_image}"\nmounts = [{{target = "/data"}}]\n')
    d = daemon_factory(workers=1, extra_args=["--config", str(cfg)]).start()
    client = openai.OpenAI(base_url=f"{d.url}/v1", api_key=d.token, max_retries=0)
    for program in ("p-live", "p-ended"):
        client.chat.completions.create(model="sim-llama3-8b", max_tokens=2,
                                       messages=[{"role": "user", "content": "go"}],
                                       extra_body={"program_id": program})
        r = d.post(f"/v1/programs/{program}/tools/box/exec", json={"command": "echo x > /data/f"})
        assert r.status_code == 200, r.text
    daemon_id = (d.data_dir / "daemon_id").read_text().strip()
    mine = {"label": [f"agentd.daemon_id={daemon_id}"]}

    def owners() -> list[str]:
        containers = docker_client.containers.list(all=True, filters=mine)
        volumes = docker_client.volumes.list(filters=mine)
        return sorted([c.labels["agentd.program_id"] for c in containers]
                      + [v.attrs["Labels"]["agentd.program_id"] for v in volumes])

    assert owners() == ["p-ended", "p-ended", "p-live", "p-live"]
    d.kill()  # SIGKILL: nothing is released
    d._reap_group()
    # p-ended was released while the daemon was down (its row says STOPPED); "p-lost" never
    # reached the store: both are orphans for the next start.
    with sqlite3.connect(d.data_dir / "agentd.db") as con:
        con.execute("UPDATE programs SET status='STOPPED' WHERE id='p-ended'")
    lost = _orphan(docker_client, busybox_image, daemon_id, "p-lost")
    other = _orphan(docker_client, busybox_image, "some-other-daemon", "p-lost")
    try:
        d.start()
        assert owners() == ["p-live", "p-live"]  # reclaimed at start, the live one kept
        assert not _exists(docker_client, lost) and _exists(docker_client, other)
        # its container and its volume, in its session's trace
        wait_for(lambda: _releases(d, "p-ended") == 2, 10,
                 lambda: f"two gc releases of p-ended, not {_releases(d, 'p-ended')}")

        # While running: an orphan appears; the dry run only lists it, gc removes it.
        late = _orphan(docker_client, busybox_image, daemon_id, "p-late")
        env = {**os.environ, "AGENTD_URL": d.url, "AGENTD_TOKEN": d.token}
        ctl = [sys.executable, "-m", "console.agentctl", "tools", "gc"]
        dry = subprocess.run([*ctl, "--dry-run"], env=env, capture_output=True, text=True,
                             timeout=60)
        assert dry.returncode == 0 and "would reclaim 1" in dry.stdout and "p-late" in dry.stdout
        assert _exists(docker_client, late)
        done = subprocess.run(ctl, env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0 and "reclaimed 1" in done.stdout, done.stderr
        assert not _exists(docker_client, late) and owners() == ["p-live", "p-live"]
    finally:
        docker_client.containers.get(other).remove(force=True)
        remove_daemon_tools(d.data_dir)
