"""Reconciliation against real resources: orphans of this daemon go, the rest stays."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from tests.docker_fixtures import busybox_image, docker_host  # noqa: F401
from tools import gc
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
        planned = await gc.reconcile(me, [backend], live_programs, dry_run=True)
        assert {r["program_id"] for r in planned} == {"stopped", "unknown"}
        kept = {r.owner.program_id for r in await backend.resources(me)}
        assert kept == {"live", "stopped", "unknown"}  # a dry run removes nothing

        events: list[dict[str, object]] = []
        done = await gc.reconcile(me, [backend], live_programs, on_event=events.append)
        assert sorted((d["program_id"], d["resource"]) for d in done) == sorted(
            (d["program_id"], d["resource"]) for d in planned
        )
        assert all(d["ok"] for d in done) and len(events) == len(done)
        assert {r.owner.program_id for r in await backend.resources(me)} == {"live"}
        assert {r.owner.program_id for r in await backend.resources(other)} == {"stopped"}
    finally:
        for daemon_id in (me, other):
            await gc.reconcile(daemon_id, [backend], lambda: ())
    assert await backend.resources(me) == [] and await backend.resources(other) == []
