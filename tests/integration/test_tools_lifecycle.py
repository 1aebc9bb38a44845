"""Tool environments end to end, against a real Docker engine and real subprocesses.

Behaviour that needs no kernel sandbox runs on both backends (the `kit` fixture is
parametrised); memory kills, dead containers and images are docker-only.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import docker
import pytest

from tests.docker_fixtures import busybox_image, docker_client, docker_host  # noqa: F401
from tests.waiting import wait_for_async
from tools import reclaim
from tools.base import LABEL_DAEMON, Backend
from tools.docker_backend import DockerBackend
from tools.errors import Reason, ToolError
from tools.manager import ToolManager
from tools.process_backend import ProcessBackend
from tools.spec import ToolSpec, parse_spec


@dataclass
class Kit:
    kind: str
    daemon_id: str
    backend: Backend
    manager: ToolManager
    image: str | None
    events: list[dict[str, Any]] = field(default_factory=list)

    def spec(self, name: str = "sh", **fields: Any) -> ToolSpec:
        base: dict[str, Any] = {"name": name, "backend": self.kind}
        if self.image:
            base["image"] = self.image
        return parse_spec(base | fields)

    def kinds(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["kind"] == kind]


@pytest.fixture(params=["docker", "process"])
async def kit(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Kit]:
    kind = request.param
    image = request.getfixturevalue("busybox_image") if kind == "docker" else None
    backend: Backend = DockerBackend() if kind == "docker" else ProcessBackend(tmp_path / "t")
    daemon_id = f"test-{uuid.uuid4().hex[:8]}"
    events: list[dict[str, Any]] = []
    manager = ToolManager(daemon_id, {kind: backend}, on_event=events.append)
    yield Kit(kind, daemon_id, backend, manager, image, events)
    await manager.close()
    await reclaim.reconcile(daemon_id, [backend], lambda: ())  # leave nothing behind
    assert await backend.resources(daemon_id) == []


async def test_exec_round_trip_with_exit_codes(kit: Kit) -> None:
    spec = kit.spec(env={"GREETING": "hello"})
    ok = await kit.manager.exec("p1", "sh", 'echo "$GREETING"; echo warn >&2', spec=spec)
    assert (ok.exit_code, ok.stdout, ok.stderr, ok.reason) == (0, "hello\n", "warn\n", Reason.OK)
    failed = await kit.manager.exec("p1", "sh", ["sh", "-c", "echo boom >&2; exit 3"])
    assert (failed.exit_code, failed.reason, failed.stderr) == (3, Reason.EXIT, "boom\n")
    missing = await kit.manager.exec("p1", "sh", "no-such-command-xyz")
    assert missing.exit_code == 127 and "not found" in missing.stderr
    ends = kit.kinds("tool.exec.end")
    assert [e["exit_code"] for e in ends] == [0, 3, 127]
    assert len(kit.kinds("tool.prepare.end")) == 1  # one environment, reused


async def test_command_prefix_and_workdir(kit: Kit) -> None:
    spec = kit.spec("echo", command=["sh", "-c"])
    result = await kit.manager.exec("p1", "echo", "pwd", spec=spec)
    assert result.ok and result.stdout.strip().endswith("work")


async def test_exec_timeout_kills_the_command_and_its_children(kit: Kit) -> None:
    await kit.manager.exec("p1", "sh", "true", spec=kit.spec())
    start = time.monotonic()
    result = await kit.manager.exec(
        "p1", "sh", "echo started; sleep 30 & sleep 30; echo never", timeout_s=0.5
    )
    assert time.monotonic() - start < 5
    assert result.reason is Reason.TIMEOUT and "timeout" in result.detail
    assert result.stdout == "started\n"
    after = await kit.manager.exec("p1", "sh", "echo alive")
    assert after.stdout == "alive\n"  # the environment outlives a timed-out command
    if kit.kind == "docker":
        ps = await kit.manager.exec("p1", "sh", "ps -o args | grep -c '[s]leep 30' || true")
        assert ps.stdout.strip() == "0", "background child of the timed-out command survived"


async def test_files_in_and_out(kit: Kit) -> None:
    await kit.manager.acquire("p1", "sh", kit.spec())
    await kit.manager.put_file("p1", "sh", "in/data.txt", b"line one\nline two\n")
    result = await kit.manager.exec("p1", "sh", "wc -l < in/data.txt > out.txt")
    assert result.ok, result.stderr
    assert (await kit.manager.get_file("p1", "sh", "out.txt")).strip() == b"2"
    with pytest.raises(ToolError) as missing:
        await kit.manager.get_file("p1", "sh", "nope.txt")
    assert missing.value.reason is Reason.BAD_PATH


async def test_memory_limit(kit: Kit) -> None:
    spec = kit.spec("hog", memory_mb=48)
    # dd allocates its whole block at once: 256 MiB against a 48 MiB limit.
    result = await kit.manager.exec(
        "p1", "hog", "dd if=/dev/zero of=/dev/null bs=256M count=1", spec=spec
    )
    assert not result.ok
    if kit.kind == "docker":
        assert result.reason is Reason.OOM and result.exit_code == 137
        assert "out-of-memory" in result.detail
    else:  # rlimit: the allocation fails instead of the kernel killing the process
        assert result.reason is Reason.EXIT and "memory" in result.stderr


async def test_release_removes_everything(kit: Kit, request: pytest.FixtureRequest) -> None:
    mounts = [{"target": "/data"}] if kit.kind == "docker" else []
    await kit.manager.exec("p1", "a", "echo x > f", spec=kit.spec("a", mounts=mounts))
    await kit.manager.exec("p1", "b", "true", spec=kit.spec("b"))
    await kit.manager.exec("p2", "a", "true", spec=kit.spec("a"))
    held = await kit.manager.list()
    assert {(r["program_id"], r["tool"]) for r in held} == {("p1", "a"), ("p1", "b"), ("p2", "a")}
    assert all(r["age_s"] >= 0 and r["disk_bytes"] is not None for r in held)
    labels = {"label": [f"{LABEL_DAEMON}={kit.daemon_id}", "agentd.program_id=p1"]}
    if kit.kind == "docker":  # the engine itself finds them by the labels
        client: docker.DockerClient = request.getfixturevalue("docker_client")
        tools = {c.labels["agentd.tool"] for c in client.containers.list(all=True, filters=labels)}
        assert tools == {"a", "b"} and len(client.volumes.list(filters=labels)) == 1

    removed = await kit.manager.release_program("p1")
    expected = {"container": 2, "volume": 1} if kit.kind == "docker" else {"dir": 2}
    assert {k: sum(r["resource"] == k for r in removed) for k in expected} == expected
    assert all(r["ok"] for r in removed) and len(kit.kinds("tool.release")) == len(removed)
    assert [r["program_id"] for r in await kit.manager.list()] == ["p2"]
    if kit.kind == "docker":  # ask the engine itself, not our own listing
        assert client.containers.list(all=True, filters=labels) == []
        assert client.volumes.list(filters=labels) == []
    with pytest.raises(ToolError) as late:
        await kit.manager.exec("p1", "a", "true")
    assert late.value.reason is Reason.RELEASED


async def test_disk_usage_per_program(kit: Kit) -> None:
    write = "dd if=/dev/zero of=blob bs=1M count=3 2>/dev/null"
    assert (await kit.manager.exec("p1", "sh", write, spec=kit.spec())).ok
    assert (await kit.manager.exec("p2", "sh", "true", spec=kit.spec())).ok
    mine = await kit.manager.list("p1")
    assert {r["program_id"] for r in mine} == {"p1"}
    assert sum(r["disk_bytes"] for r in mine) >= 3 << 20
    assert sum(r["disk_bytes"] for r in await kit.manager.list("p2")) < 1 << 20
    assert (await kit.manager.usage())["disk_bytes"] >= 3 << 20


async def test_preparation_overlaps_reasoning(kit: Kit) -> None:
    spec = kit.spec("slow", setup=["sleep 1", "echo ready > ready.txt"])
    # Cold: nobody prepared ahead, so the first exec pays the whole preparation.
    cold = await _timed_exec(kit, "cold", spec)
    # Warm: preparation starts when the tool is known; the program "reasons" for 0.7 s
    # (a program that takes its time is what is measured, not a wait on the manager).
    kit.manager.prepare("warm", spec)
    await asyncio.sleep(0.7)
    warm = await _timed_exec(kit, "warm", spec)
    prepare_s = {e["program_id"]: e["duration_s"] for e in kit.kinds("tool.prepare.end")}
    assert cold >= 1.0 and prepare_s["cold"] >= 1.0
    # The wait is only what is left of the preparation: about prepare - 0.7 s.
    assert warm <= prepare_s["warm"] - 0.7 + 0.25, (warm, prepare_s)
    # Against its own preparation, not the cold one: two container starts on a loaded
    # host differ by more than the 0.7 s being measured.
    assert warm < prepare_s["warm"] - 0.5 and cold >= prepare_s["cold"] - 0.05
    print(f"\n[{kit.kind}] prepare {prepare_s}, exec wait cold {cold:.3f}s warm {warm:.3f}s")


async def _timed_exec(kit: Kit, program_id: str, spec: ToolSpec) -> float:
    result = await kit.manager.exec(program_id, spec.name, "cat ready.txt", spec=spec)
    assert result.stdout == "ready\n"
    end = [e for e in kit.kinds("tool.exec.end") if e["program_id"] == program_id][-1]
    return float(end["waited_s"])


async def test_failed_setup_is_reported_and_isolated(kit: Kit) -> None:
    await kit.manager.exec("p1", "good", "true", spec=kit.spec("good"))
    bad = kit.spec("bad", setup=["echo installing; echo 'no such package' >&2; exit 7"])
    with pytest.raises(ToolError) as failed:
        await kit.manager.exec("p1", "bad", "true", spec=bad)
    err = failed.value
    assert (err.reason, err.exit_code, err.tool, err.program_id) == (
        Reason.SETUP_FAILED,
        7,
        "bad",
        "p1",
    )
    assert "no such package" in err.stderr_tail
    assert (await kit.manager.exec("p1", "good", "echo still")).stdout == "still\n"
    assert {r["tool"] for r in await kit.manager.list()} == {"good"}  # nothing left of "bad"


async def test_dead_container_is_reported_then_replaced(
    kit: Kit, request: pytest.FixtureRequest
) -> None:
    if kit.kind != "docker":
        pytest.skip("a process environment has no container to die")
    env = await kit.manager.acquire("p1", "sh", kit.spec())
    await kit.manager.exec("p1", "other", "true", spec=kit.spec("other"))
    client: docker.DockerClient = request.getfixturevalue("docker_client")
    client.containers.get(env.id).kill()
    with pytest.raises(ToolError) as dead:
        await kit.manager.exec("p1", "sh", "true")
    assert dead.value.reason is Reason.DEAD
    assert (await kit.manager.exec("p1", "other", "echo ok")).stdout == "ok\n"
    fresh = await kit.manager.acquire("p1", "sh")
    assert fresh.id != env.id and (await kit.manager.exec("p1", "sh", "echo new")).ok


async def test_unknown_image_leaves_nothing(kit: Kit) -> None:
    if kit.kind != "docker":
        pytest.skip("images are a docker notion")
    spec = parse_spec(
        {"name": "ghost", "image": "agentd-no-such-image:1", "mounts": [{"target": "/data"}]}
    )
    with pytest.raises(ToolError) as missing:
        await kit.manager.exec("p1", "ghost", "true", spec=spec)
    assert missing.value.reason is Reason.UNKNOWN_IMAGE
    assert await kit.manager.list() == []  # the volume made before the failure is gone too


async def test_engine_down_is_a_structured_error(tmp_path: Path) -> None:
    backend = DockerBackend(base_url=f"unix://{tmp_path}/absent.sock")
    manager = ToolManager("d", {"docker": backend})
    spec = parse_spec({"name": "sh", "image": "agentd-busybox:latest"})
    with pytest.raises(ToolError) as down:
        await manager.exec("p1", "sh", "true", spec=spec)
    assert down.value.reason is Reason.ENGINE_DOWN
    assert (await manager.list())[0]["error"]["reason"] == "engine_down"


async def test_metrics_count_what_happened(kit: Kit) -> None:
    await kit.manager.exec("p1", "sh", "exit 2", spec=kit.spec())
    metrics = await kit.manager.metrics()
    assert metrics["prepares_total"] == {"ok": 1} and metrics["execs_total"] == {"exit": 1}
    assert metrics["exec_seconds"]["count"] == 1 and metrics["disk_bytes"] >= 0
    [held] = metrics["resources"]
    assert (held["backend"], held["count"], metrics["programs_holding"]) == (kit.kind, 1, 1)
    assert metrics["backends_down"] == []


async def test_concurrent_disk_listings(kit: Kit) -> None:
    # Older engines refuse a second `df` while one runs; listings must wait, not fail.
    for program in ("p1", "p2", "p3", "p4"):
        await kit.manager.exec(program, "sh", "echo x > f", spec=kit.spec())
    listings = await asyncio.gather(*(kit.manager.list() for _ in range(6)))
    for rows in listings:
        assert sorted(r["program_id"] for r in rows) == ["p1", "p2", "p3", "p4"], rows


async def test_a_call_whose_caller_gives_up_still_ends(kit: Kit) -> None:
    """A client that disconnects cancels its call; the call still gets its end event, or
    the KV layer would believe the program's tool runs for ever."""
    spec = kit.spec()
    await kit.manager.exec("p1", "sh", "true", spec=spec)
    call = asyncio.create_task(kit.manager.exec("p1", "sh", "sleep 5"))
    await wait_for_async(lambda: len(kit.kinds("tool.exec.start")) == 2, 10, "the call to start")
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    starts, ends = kit.kinds("tool.exec.start"), kit.kinds("tool.exec.end")
    assert len(starts) == len(ends) == 2
    assert (ends[-1]["reason"], ends[-1]["ok"], ends[-1]["exec_id"]) == (
        "cancelled", False, starts[-1]["exec_id"])
    await kit.manager.release_program("p1")
