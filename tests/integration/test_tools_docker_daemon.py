"""Docker tools through a real daemon and its REST API: structured errors that leave
nothing behind and do not break the program, per-request specs, per-program disk from the
engine's `df`, and the `agentd_tool_*` metrics."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import docker
import openai
import pytest

from tests.daemon_process import DaemonProcess
from tests.streams import streamed_exec
from tests.tool_cleanup import remove_daemon_tools
from tests.waiting import wait_for

MODEL = "sim-llama3-8b"


def _config(tmp: Path, image: str) -> Path:
    path = tmp / "agentd.toml"
    path.write_text(f"""
[tools.box]
image = "{image}"
memory_mb = 64
exec_timeout_s = 10
mounts = [{{target = "/data"}}]

[tools.ghost]
image = "agentd-no-such-image:1"

[tools.broken]
image = "{image}"
setup = ["echo installing; echo 'E: no such package' >&2; exit 7"]
""")
    return path


@pytest.fixture
def docker_daemon(daemon_factory: Callable[..., DaemonProcess], tmp_path: Path,
                  busybox_image: str) -> Iterator[DaemonProcess]:
    d = daemon_factory(workers=1, extra_args=["--config", str(_config(tmp_path, busybox_image))])
    yield d.start()
    remove_daemon_tools(d.data_dir)


def chat(d: DaemonProcess, program: str) -> str:
    reply = openai.OpenAI(base_url=f"{d.url}/v1", api_key=d.token, max_retries=0)
    out = reply.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "next step"}], max_tokens=2,
        extra_body={"program_id": program})
    return out.choices[0].message.content or ""


def execute(d: DaemonProcess, program: str, tool: str, command: str,
            **extra: Any) -> tuple[int, dict[str, Any]]:
    r = d.post(f"/v1/programs/{program}/tools/{tool}/exec", json={"command": command, **extra})
    return r.status_code, r.json()


def held(d: DaemonProcess, program: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = d.get("/v1/tools", params={"program_id": program}).json()["data"]
    return rows


def engine_holds(client: docker.DockerClient, d: DaemonProcess, program: str) -> int:
    daemon_id = (d.data_dir / "daemon_id").read_text().strip()
    labels = {"label": [f"agentd.daemon_id={daemon_id}", f"agentd.program_id={program}"]}
    return len(client.containers.list(all=True, filters=labels)) + len(
        client.volumes.list(filters=labels))


def tool_metrics(d: DaemonProcess, until: str) -> tuple[dict[str, str], str]:
    """`agentd_tool_*` samples from /metrics once `until` shows: what the engine holds is
    read in the background, so a scrape may show the previous reading."""
    def showing() -> str | None:
        text = d.get("/metrics").text
        return text if until in text else None

    text: str = wait_for(showing, 20, lambda: f"{until!r} on /metrics:\n{d.get('/metrics').text}",
                         interval=0.5)
    return dict(re.findall(r"^(agentd_tool_[^ ]+) (\S+)$", text, re.M)), text


def test_tool_failures_are_structured_and_leave_nothing(
    docker_daemon: DaemonProcess, docker_client: docker.DockerClient
) -> None:
    d = docker_daemon
    chat(d, "p-bad")
    status, out = execute(d, "p-bad", "box", "echo hi; echo oops >&2; exit 3")
    assert (status, out["exit_code"], out["reason"], out["stderr"]) == (200, 3, "exit", "oops\n")
    status, out = execute(d, "p-bad", "box", "sleep 30", timeout_s=0.5)
    assert (status, out["reason"]) == (200, "timeout") and out["duration_s"] < 5

    status, out = execute(d, "p-bad", "ghost", "true")
    assert status == 422 and out["error"]["code"] == "unknown_image"
    assert out["error"]["tool_error"]["reason"] == "unknown_image"
    status, out = execute(d, "p-bad", "broken", "true")
    err = out["error"]["tool_error"]
    assert status == 502 and (err["reason"], err["exit_code"]) == ("setup_failed", 7)
    assert "no such package" in err["stderr_tail"] and err["program_id"] == "p-bad"
    assert {r["tool"] for r in held(d, "p-bad")} == {"box"}  # nothing of ghost or broken

    [box] = [r for r in held(d, "p-bad") if r["resource"] == "container"]
    docker_client.containers.get(box["id"]).kill()
    status, out = execute(d, "p-bad", "box", "true")
    assert status == 502 and out["error"]["tool_error"]["reason"] == "dead"
    status, out = execute(d, "p-bad", "box", "echo fresh")  # a new environment, same program
    assert (status, out["stdout"]) == (200, "fresh\n")
    assert box["id"] not in {r["id"] for r in held(d, "p-bad")}

    assert chat(d, "p-bad")  # the program itself is unharmed
    assert d.post("/v1/programs/p-bad/release").status_code == 200
    wait_for(lambda: engine_holds(docker_client, d, "p-bad") == 0, 15,
             "the engine to hold nothing of p-bad")


def test_a_streamed_exec_in_a_container(docker_daemon: DaemonProcess) -> None:
    """The container's output comes as it is written (read in a thread, handed to the
    event loop); a failing environment ends the stream with the error the plain exec
    answers."""
    d = docker_daemon
    chat(d, "p-stream")
    events = streamed_exec(d, "p-stream", "box", {
        "command": "for i in 1 2 3; do echo line$i; sleep 0.3; done; echo oops >&2"})
    text = {name: "".join(e["text"] for _, k, e in events if k == "output" and
                          e["stream"] == name) for name in ("stdout", "stderr")}
    assert text == {"stdout": "line1\nline2\nline3\n", "stderr": "oops\n"}
    first = next(t for t, k, _ in events if k == "output")
    assert events[-1][1] == "result" and events[-1][0] - first > 0.5
    assert events[-1][2]["exit_code"] == 0
    (_, kind, error), = streamed_exec(d, "p-stream", "ghost", {"command": "true"})
    assert kind == "error" and error["status"] == 422
    assert error["error"]["tool_error"]["reason"] == "unknown_image"


def test_per_request_specs(docker_daemon: DaemonProcess, busybox_image: str) -> None:
    d = docker_daemon
    adhoc = {"name": "adhoc", "image": busybox_image, "env": {"MODE": "declared"},
             "setup": ["echo prepared > marker"]}
    r = d.post("/v1/programs/p-req/tools", json={"tools": ["box", adhoc]})
    assert r.status_code == 200 and r.json()["tools"] == ["box", "adhoc"], r.text
    chat(d, "p-req")
    status, out = execute(d, "p-req", "adhoc", 'echo "$MODE"; cat marker')
    assert (status, out["stdout"]) == (200, "declared\nprepared\n"), out
    # A tool nobody configured or declared, its spec in the exec request itself.
    status, out = execute(d, "p-req", "oneoff", "echo $X", spec={"image": busybox_image,
                                                                  "env": {"X": "inline"}})
    assert (status, out["stdout"]) == (200, "inline\n"), out
    status, out = execute(d, "p-req", "oneoff", "echo again")  # remembered for the program
    assert (status, out["stdout"]) == (200, "again\n"), out
    # Overrides of a configured tool: a shorter timeout.
    status, out = execute(d, "p-req", "box", "sleep 5", spec={"exec_timeout_s": 0.3})
    assert (status, out["reason"]) == (200, "timeout")

    refused: list[tuple[str, str, dict[str, Any], str]] = [
        ("p-req", "x", {"spec": {"image": busybox_image, "network": "host"}}, "network"),
        ("p-req", "x", {"spec": {"image": busybox_image,
                                 "mounts": [{"type": "bind", "source": "/", "target": "/h"}]}},
         "mounts"),
        ("p-req", "x", {"spec": {"image": busybox_image, "memory_mb": "lots"}}, "memory_mb"),
    ]
    for program, tool, extra, field in refused:
        status, out = execute(d, program, tool, "true", **extra)
        assert status == 400 and field in out["error"]["message"], out
        assert out["error"]["param"] == "spec"
    r = d.post("/v1/programs/p-req2/tools", json={"tools": ["box", {"name": "y"}]})
    assert r.status_code == 400 and "tools[1]" in r.json()["error"]["message"], r.text
    r = d.post("/v1/programs/p-req2/tools", json={"tools": ["nope"]})
    assert r.status_code == 404 and "nope" in r.json()["error"]["message"]


def test_listing_disk_per_program_and_metrics(docker_daemon: DaemonProcess) -> None:
    d = docker_daemon
    for program in ("p-big", "p-small"):
        chat(d, program)
    status, _ = execute(d, "p-big", "box", "dd if=/dev/zero of=/work/blob bs=1M count=3")
    assert status == 200
    status, _ = execute(d, "p-big", "box", "dd if=/dev/zero of=/data/blob bs=1M count=2")
    assert status == 200
    assert execute(d, "p-small", "box", "true")[0] == 200

    listing = d.get("/v1/tools").json()
    rows = [r for r in listing["data"] if r["program_id"] == "p-big"]
    assert {r["resource"] for r in rows} == {"container", "volume"}
    [container] = [r for r in rows if r["resource"] == "container"]
    assert container["state"] == "running" and container["tool"] == "box"
    assert container["age_s"] >= 0 and container["daemon_id"]
    by_program = listing["by_program"]
    assert by_program["p-big"]["resources"] == 2
    assert by_program["p-big"]["disk_bytes"] >= 5 << 20  # writable layer + volume
    assert by_program["p-small"]["disk_bytes"] < 1 << 20
    assert {r["program_id"] for r in held(d, "p-small")} == {"p-small"}

    samples, text = tool_metrics(d, until="agentd_tool_programs 2")
    running = 'agentd_tool_resources{backend="docker",resource="container",state="running"}'
    assert float(samples.get(running, -1)) == 2, text
    assert float(samples["agentd_tool_disk_bytes"]) >= 5 << 20
    assert float(samples["agentd_tool_programs"]) == 2
    assert float(samples['agentd_tool_prepares_total{outcome="ok"}']) == 2
    assert float(samples["agentd_tool_prepare_seconds_count"]) == 2
    assert float(samples["agentd_tool_exec_seconds_count"]) == 3
    assert float(samples['agentd_tool_backend_up{backend="docker"}']) == 1


def test_engine_down_is_a_structured_error(daemon_factory: Callable[..., DaemonProcess],
                                           tmp_path: Path) -> None:
    d = daemon_factory(workers=1, extra_args=["--config", str(_config(tmp_path, "busybox"))],
                       env={"DOCKER_HOST": f"unix://{tmp_path}/no-engine.sock"}).start()
    chat(d, "p-down")
    status, out = execute(d, "p-down", "box", "true")
    assert status == 503 and out["error"]["tool_error"]["reason"] == "engine_down"
    [row] = [r for r in d.get("/v1/tools").json()["data"] if r["backend"] == "docker"]
    assert row["resource"] == "error" and row["error"]["reason"] == "engine_down"
    tool_metrics(d, until='agentd_tool_backend_up{backend="docker"} 0')
    assert chat(d, "p-down")  # the program and the daemon carry on
    assert d.post("/v1/programs/p-down/release").status_code == 200
