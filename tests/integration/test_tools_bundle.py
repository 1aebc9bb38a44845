"""Tool specs in a workflow bundle's manifest, on a real daemon (sim worker): upload checks,
the process backend only from operators, names scoped to the bundle's runs and never
shadowing a configured tool, and a run's program using (and declaring up front, so it is
prepared while the sandbox starts and reasons) the bundle's tool, with the process backend
and, when a Docker engine is up, the docker backend."""

from __future__ import annotations

import argparse
import contextlib
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import httpx
import openai
import pytest

from console.client import AgentdClient, ClientError
from console.workflow_cmd import add_workflow_parser
from tests.daemon_process import DaemonProcess
from tests.tool_cleanup import remove_daemon_tools
from tests.waiting import wait_for, wait_for_trace

SETUP_S = 1.5
# The sandbox calls its own program's tool with its run token, as a workflow would.
MAIN = '''
import os
import time

import httpx


def main(command: str, tool: str, pause_s: float = 0.0) -> dict:
    time.sleep(pause_s)  # "reasoning" that the preparation hides behind: what is tested
    url, program = os.environ["AGENTD_DAEMON_URL"], os.environ["AGENTD_PROGRAM_ID"]
    r = httpx.post(f"{url}/v1/programs/{program}/tools/{tool}/exec",
                   json={"command": command}, timeout=60,
                   headers={"Authorization": "Bearer " + os.environ["AGENTD_RUN_TOKEN"]})
    return {"status": r.status_code, "body": r.json()}
'''
FILES = {"main.py": MAIN}


@pytest.fixture(scope="module")
def d(tmp_path_factory: pytest.TempPathFactory,
      request: pytest.FixtureRequest) -> Iterator[DaemonProcess]:
    tmp = tmp_path_factory.mktemp("bundle-tools")
    cfg = tmp / "agentd.toml"
    cfg.write_text('[tools.shell]\nbackend = "process"\n')
    # The engine the docker case's bundle uses, known before the daemon starts (a test
    # asking for it later would leave this daemon without one); none: process cases only.
    env = {}
    with contextlib.suppress(pytest.skip.Exception):
        env["DOCKER_HOST"] = request.getfixturevalue("docker_host")
    daemon = DaemonProcess(tmp / "data", extra_args=["--config", str(cfg)], env=env).start()
    yield daemon
    daemon.stop()
    with contextlib.suppress(docker.errors.DockerException):  # no engine: nothing to remove
        remove_daemon_tools(daemon.data_dir)


@pytest.fixture(scope="module")
def submit_token(d: DaemonProcess) -> str:
    done = d.cli("token", "create", "--scope", "submit", "--name", "bundle-client")
    assert done.returncode == 0 and re.search(r"created token tok-\w+", done.stderr), done.stderr
    return done.stdout.strip()


def register(d: DaemonProcess, name: str, tools: Any, token: str | None = None
             ) -> httpx.Response:
    return d.post("/v1/workflows", token=token,
                  json={"name": name, "files": FILES, "entry": "main:main", "tools": tools})


def names(d: DaemonProcess) -> set[str]:
    return {w["name"] for w in d.get("/v1/workflows").json()["data"]}


def test_a_bad_spec_is_refused_naming_the_field_and_registers_nothing(d: DaemonProcess) -> None:
    r = register(d, "bad-spec", {"box": {"image": "busybox", "memory_mb": "lots"}})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert (err["param"], err["code"]) == ("tools.box.memory_mb", "bad_tool_spec")
    r = register(d, "bad-spec", {"box": {"image": "busybox", "network": "host"}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "tools.box.network"
    r = register(d, "bad-spec", ["box"])
    assert r.status_code == 400 and r.json()["error"]["param"] == "tools"
    assert "bad-spec" not in names(d)


def test_the_process_backend_needs_an_operator_to_upload(d: DaemonProcess,
                                                         submit_token: str) -> None:
    sh = {"sh": {"backend": "process"}}
    r = register(d, "host-cmd", sh, token=submit_token)
    assert r.status_code == 403, r.text
    assert r.json()["error"]["param"] == "tools.sh.backend"
    assert "host-cmd" not in names(d)
    # A container spec is fine from a submit client: it is as untrusted as a request's.
    box = {"box": {"image": "agentd-busybox", "memory_mb": 64}}
    r = register(d, "boxed", box, token=submit_token)
    assert r.status_code == 201, r.text
    assert r.json()["tools"] == box
    r = register(d, "host-cmd", sh)  # the operator's token
    assert r.status_code == 201 and r.json()["tools"] == sh


def test_a_bundle_tool_cannot_take_a_configured_name(d: DaemonProcess) -> None:
    r = register(d, "shadow", {"shell": {"backend": "process", "exec_timeout_s": 1}})
    assert r.status_code == 409, r.text
    assert (r.json()["error"]["param"], r.json()["error"]["code"]) == (
        "tools.shell", "tool_name_taken")
    assert "shadow" not in names(d)


def test_run_declarations_are_checked_before_the_run_starts(d: DaemonProcess) -> None:
    assert register(d, "decl", {"sh": {"backend": "process"}}).status_code == 201
    before = len(d.get("/v1/runs").json()["data"])
    r = d.post("/v1/runs", json={"workflow": "decl", "args": {"command": "true", "tool": "sh"},
                                 "tools": ["sh", "nope"]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "tools", r.text
    assert "tools[1]" in r.json()["error"]["message"]
    assert len(d.get("/v1/runs").json()["data"]) == before


@pytest.fixture(params=["process", "docker"])
def bundle_spec(request: pytest.FixtureRequest) -> dict[str, Any]:
    setup = [f"sleep {SETUP_S}", "echo ready > ready"]
    if request.param == "process":
        return {"backend": "process", "setup": setup}
    return {"image": request.getfixturevalue("busybox_image"), "setup": setup, "memory_mb": 64}


def test_a_run_uses_its_bundles_tool_prepared_while_it_reasons(
        d: DaemonProcess, bundle_spec: dict[str, Any]) -> None:
    name = f"env-{bundle_spec.get('backend', 'docker')}"
    assert register(d, name, {"env": bundle_spec}).status_code == 201
    session = f"s-{name}"
    view = d.run_to_end({"workflow": name, "session_id": session, "tools": ["env"],
                         "args": {"command": "cat ready", "tool": "env",
                                  "pause_s": SETUP_S + 1.0}}, timeout=60)
    assert view["status"] == "finished", view
    assert view["result"]["status"] == 200, view["result"]
    assert view["result"]["body"]["stdout"] == "ready\n"
    events = wait_for_trace(d, session, "run.finished")
    kinds = [e["kind"] for e in events]
    assert kinds.index("tool.prepare.start") < kinds.index("tool.prepare.end") < kinds.index(
        "tool.exec.start")
    prepared = next(e for e in events if e["kind"] == "tool.prepare.end")
    assert prepared["data"]["ok"] and prepared["data"]["duration_s"] >= SETUP_S
    exec_end = next(e for e in events if e["kind"] == "tool.exec.end")
    assert exec_end["data"]["waited_s"] < SETUP_S / 2, exec_end  # the setup was hidden
    # Released with the run: nothing of its program is left.
    program = view["program_id"]
    wait_for(lambda: not [t for t in d.get("/v1/tools", params={"program_id": program}).json()[
        "data"] if t.get("program_id") == program], 15, "the run's tool environment to go")
    wait_for_trace(d, session, "tool.release")


def test_bundle_tools_are_not_visible_outside_the_bundles_runs(d: DaemonProcess) -> None:
    assert register(d, "scoped", {"only-here": {"backend": "process"}}).status_code == 201
    client = openai.OpenAI(base_url=f"{d.url}/v1", api_key=d.token, max_retries=0)
    client.chat.completions.create(model="sim-llama3-8b", max_tokens=2,
                                   messages=[{"role": "user", "content": "hi"}],
                                   extra_body={"program_id": "p-outside"})
    r = d.post("/v1/programs/p-outside/tools/only-here/exec", json={"command": "true"})
    assert r.status_code == 404 and "only-here" in r.json()["error"]["message"]
    r = d.post("/v1/programs/p-outside/tools", json={"tools": ["only-here"]})
    assert r.status_code == 404
    assert d.get("/v1/programs/p-outside/tools").json()["bundle_tools"] == []
    # The configured tool stays usable next to bundles.
    r = d.post("/v1/programs/p-outside/tools/shell/exec", json={"command": "echo ok"})
    assert r.status_code == 200 and r.json()["stdout"] == "ok\n"


def submit_parser() -> argparse.ArgumentParser:
    from console import agentctl

    parser = argparse.ArgumentParser()
    add_workflow_parser(parser.add_subparsers(dest="command"),
                        lambda p: agentctl._common(p, suppress=False))
    return parser


def test_agentctl_submit_sends_the_bundles_tools_toml(d: DaemonProcess,
                                                      tmp_path: Path) -> None:
    (tmp_path / "main.py").write_text(MAIN)
    (tmp_path / "tools.toml").write_text('[tools.echoer]\nbackend = "process"\n')
    args = submit_parser().parse_args(
        ["submit", str(tmp_path), "--name", "cli-tools", "--follow", "--json",
         "--args", '{"command": "echo from-cli", "tool": "echoer"}',
         "--url", d.url, "--token", d.token])
    with AgentdClient(args.url, args.token) as client:
        assert args.tui_command(client, args) == 0
    [wf] = [w for w in d.get("/v1/workflows").json()["data"] if w["name"] == "cli-tools"]
    assert wf["latest"]["tools"] == {"echoer": {"backend": "process"}}
    assert "tools.toml" not in wf["latest"]["files"]  # sent as specs, not shipped as a file
    run = next(r for r in d.get("/v1/runs").json()["data"] if r["workflow"] == "cli-tools")
    result = d.get(f"/v1/runs/{run['id']}").json()["result"]
    assert result["status"] == 200 and result["body"]["stdout"] == "from-cli\n", result


def test_agentctl_submit_refuses_a_bad_tools_file_in_one_line(d: DaemonProcess,
                                                              tmp_path: Path) -> None:
    (tmp_path / "main.py").write_text(MAIN)
    (tmp_path / "tools.toml").write_text("[tools.box]\nimage = 'busybox'\nmemory_mb = 'lots'\n")
    parser = submit_parser()
    args = parser.parse_args(["submit", str(tmp_path), "--name", "cli-bad-tools",
                              "--url", d.url, "--token", d.token])
    with AgentdClient(args.url, args.token) as client, pytest.raises(
            ClientError, match=r"tools\.box: .*memory_mb"):
        args.tui_command(client, args)
    (tmp_path / "other.toml").write_text("name = 'x'\n")
    args = parser.parse_args(["submit", str(tmp_path), "--tools", str(tmp_path / "other.toml"),
                              "--name", "cli-bad-tools", "--url", d.url, "--token", d.token])
    with AgentdClient(args.url, args.token) as client, pytest.raises(
            ClientError, match=r"expected only \[tools.NAME\] tables"):
        args.tui_command(client, args)
    assert "cli-bad-tools" not in names(d)
