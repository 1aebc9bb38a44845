"""Workflows end to end on a real daemon with a simulated engine: bundles, runs in
sandboxes, the router, analyst and software-engineering examples, limits and the
sandbox's file guard, and the global controller migrating calls between instances."""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from console.workflow_cmd import add_workflow_parser, read_bundle
from tests.daemon_process import DaemonProcess
from tests.waiting import wait_for, wait_for_trace

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


@pytest.fixture(scope="module")
def d(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    daemon = DaemonProcess(tmp_path_factory.mktemp("wf") / "data").start()
    yield daemon
    daemon.stop()


def register(d: DaemonProcess, name: str, files: dict[str, str],
             entry: str = "main:main") -> httpx.Response:
    return d.post("/v1/workflows", json={"name": name, "files": files, "entry": entry})


def test_router_example_both_branches(d: DaemonProcess) -> None:
    assert register(d, "router", read_bundle(EXAMPLES / "router")).status_code == 201
    coding = d.run_to_end({"workflow": "router", "session_id": "s-router",
                           "args": {"request": "fix the bug in my python function"}})
    assert coding["status"] == "finished", coding
    assert coding["result"]["branch"] == "coding" and coding["result"]["answer"]
    chat = d.run_to_end({"workflow": "router", "session_id": "s-router",
                         "args": {"request": "how are you today?"}})
    assert chat["result"]["branch"] == "chat"
    assert chat["result"]["turns"] == "2"  # the ManagedList persisted in the session
    session = d.get("/v1/sessions/s-router").json()
    assert session is not None
    programs = d.get("/v1/programs", params={"session": "s-router"}).json()["data"]
    ids = {p["id"] for p in programs}
    assert coding["program_id"] in ids and chat["program_id"] in ids
    assert any(i.startswith(coding["program_id"] + ".Classifier") for i in ids)
    assert all(p["status"] == "STOPPED" for p in programs)  # released at run end
    events = wait_for_trace(d, "s-router", "run.finished", count=2)
    kinds = {e["kind"] for e in events}
    assert {"run.created", "run.started", "run.finished", "future.created",
            "future.resolved", "request.queued"} <= kinds
    created = [e for e in events if e["kind"] == "future.created"]
    assert all("creator" in e["data"] and "dependencies" in e["data"] for e in created)


def test_analyst_example_fans_out_and_streams_events(d: DaemonProcess) -> None:
    assert register(d, "analyst", read_bundle(EXAMPLES / "analyst")).status_code == 201
    r = d.post("/v1/runs", json={"workflow": "analyst", "args": {"ticker": "ACME"}})
    assert r.status_code == 201, r.text
    run = r.json()
    events = []
    with httpx.stream("GET", f"{d.url}/v1/runs/{run['id']}/events", timeout=30,
                      headers=d.auth_headers()) as resp:
        for line in resp.iter_lines():
            if line.startswith("data:") and line != "data: [DONE]":
                events.append(json.loads(line[5:]))
    view = d.get(f"/v1/runs/{run['id']}").json()
    assert view["status"] == "finished", view
    result = view["result"]
    assert result["summary"].startswith("ACME: stock:") and len(result["parts"]) == 3
    assert events[0]["kind"] == "run.created" and events[-1]["kind"] == "run.finished"
    created = {e["id"]: e for e in events if e["kind"] == "future.created"}
    resolved = {e["id"] for e in events if e["kind"] == "future.resolved"}
    assert set(created) == resolved and len(created) == 5
    data_future = next(i for i, e in created.items() if e["name"] == "market_data")
    stock = next(e for e in created.values() if e["name"] == "StockAgent.analyse")
    assert stock["dependencies"] == [data_future]
    summary = next(e for e in created.values() if e["name"] == "Summariser.summarise")
    assert len(summary["dependencies"]) == 3
    assert all(e["session_id"] == run["session_id"] for e in events)
    assert view["timings"]["duration_s"] > 0


def test_swe_example_plans_develops_tests_and_retries(d: DaemonProcess) -> None:
    """NALAR's software-engineering workflow: planner -> developers -> testers, failed
    subtasks retried with the test log; agents behind generated stubs."""
    assert register(d, "swe", read_bundle(EXAMPLES / "swe")).status_code == 201
    view = d.run_to_end({"workflow": "swe", "session_id": "s-swe",
                         "args": {"request": "OAuth login", "size": 5}}, timeout=90)
    assert view["status"] == "finished", view
    result = view["result"]
    # the tester fails the data model and the docs once, the user interface twice
    assert result["attempts"] == [1, 0, 2, 0, 1] and result["retries"] == 4
    assert result["code"].count("(attempt ") == 5 and result["requests_in_session"] == 1
    events = wait_for_trace(d, "s-swe", "run.finished")
    placed = [e["data"] for e in events if e["kind"] == "future.placed"]
    developers = {e["instance"] for e in placed if e["agent_type"] == "Developer"}
    assert developers == {"Developer#0", "Developer#1", "Developer#2"}  # max_instances
    assert {e["instance"] for e in placed if e["agent_type"] == "Planner"} == {"Planner#0"}
    retried = [e for e in placed if e["agent_type"] == "Developer" and e["attempt"] > 0]
    assert len(retried) == 4 and max(e["attempt"] for e in retried) == 2
    testers = [e for e in placed if e["agent_type"] == "Tester"]
    assert all(e["stage"] == 2 for e in testers)  # docs tool -> developer -> tester


def test_bundle_errors_register_nothing(d: DaemonProcess) -> None:
    r = register(d, "broken", {"main.py": "def main():\n    return 1\n",
                               "lib/util.py": "def f(:\n"})
    assert r.status_code == 400
    err = r.json()["error"]
    assert "lib/util.py line 1" in err["message"] and err["code"] == "syntax_error"
    r = register(d, "broken", {"main.py": "def other():\n    pass\n"})
    assert r.status_code == 400 and "entry function 'main'" in r.json()["error"]["message"]
    names = [w["name"] for w in d.get("/v1/workflows").json()["data"]]
    assert "broken" not in names
    assert d.post("/v1/runs", json={"workflow": "broken"}).status_code == 404
    assert register(d, "needs", {"main.py": "def main(a, b=2):\n    return a\n"}).status_code == 201
    r = d.post("/v1/runs", json={"workflow": "needs", "args": {"b": 1}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "args.a"
    r = d.post("/v1/runs", json={"workflow": "needs", "args": {"a": 1, "c": 1}})
    assert r.status_code == 400 and "unknown argument 'c'" in r.json()["error"]["message"]


def test_user_error_names_agent_and_path(d: DaemonProcess) -> None:
    src = ("import agentd\n\n@agentd.agent\nclass Bad:\n    def go(self, x):\n"
           "        return 1 / x\n\ndef main():\n    return Bad().go(0) + 1\n")
    assert register(d, "fails", {"main.py": src}).status_code == 201
    view = d.run_to_end({"workflow": "fails"})
    err = view["error"]
    assert view["status"] == "failed" and err["kind"] == "user"
    assert err["type"] == "ZeroDivisionError" and "agent Bad.go" in err["agent"]
    assert err["path"] == "main.py:6" and "Traceback" in err["traceback"]


def test_memory_limit_stops_the_run(d: DaemonProcess) -> None:
    src = ("def main():\n    blocks = [bytearray(64 * 2**20) for _ in range(64)]\n"
           "    return len(blocks)\n")
    assert register(d, "hog", {"main.py": src}).status_code == 201
    view = d.run_to_end({"workflow": "hog", "limits": {"memory_mb": 400}})
    assert view["status"] == "failed"
    assert view["error"]["kind"] == "system"
    assert "memory limit exceeded" in view["error"]["reason"]


def test_cpu_limit_stops_the_run(d: DaemonProcess) -> None:
    src = "def main():\n    while True:\n        pass\n"
    assert register(d, "spin", {"main.py": src}).status_code == 201
    view = d.run_to_end({"workflow": "spin", "limits": {"cpu_s": 1}}, timeout=60)
    assert view["status"] == "failed"
    assert view["error"]["reason"] == "cpu time limit exceeded (1 s)"


def test_run_cannot_open_the_daemon_database(d: DaemonProcess) -> None:
    db = d.data_dir / "agentd.db"
    assert db.is_file()
    src = ("import sqlite3\n\ndef main(path: str, how: str):\n"
           "    if how == 'open':\n        return open(path, 'rb').read(16).hex()\n"
           "    return sqlite3.connect(path).execute('select 1').fetchall()\n")
    assert register(d, "snoop", {"main.py": src}).status_code == 201
    for how in ("open", "sqlite"):
        view = d.run_to_end({"workflow": "snoop", "args": {"path": str(db), "how": how}})
        assert view["status"] == "failed", view
        assert "agentd sandbox" in view["error"]["message"] and str(db) in view["error"]["message"]
        assert view["error"]["type"] == "SandboxDenied"
    # and nothing of the daemon's is in its environment
    env_src = "import os\n\ndef main():\n    return dict(os.environ)\n"
    assert register(d, "env", {"main.py": env_src}).status_code == 201
    env = d.run_to_end({"workflow": "env"})["result"]
    assert str(d.data_dir) not in json.dumps(env)
    assert set(env) <= {"PATH", "LANG", "MALLOC_ARENA_MAX", "PYTHONUNBUFFERED", "AGENTD_RUN_ID",
                        "AGENTD_PROGRAM_ID", "AGENTD_SESSION_ID", "AGENTD_DAEMON_URL",
                        "AGENTD_RUN_TOKEN", "LC_CTYPE", "AGENTD_GPUS",
                        "AGENTD_RESOURCE_WAIT_S"}
    # the run token was revoked when the run ended
    wait_for(lambda: d.get("/v1/models", token=env["AGENTD_RUN_TOKEN"]).status_code == 401,
             10, "the ended run's token to be refused")


def test_cancel_kills_the_sandbox_and_releases(d: DaemonProcess) -> None:
    src = "import time\n\ndef main():\n    time.sleep(60)\n"  # runs until cancelled
    assert register(d, "sleepy", {"main.py": src}).status_code == 201
    run = d.post("/v1/runs", json={"workflow": "sleepy"}).json()
    wait_for(lambda: d.get(f"/v1/runs/{run['id']}").json()["status"] == "running", 30,
             "the sandbox to run")
    r = httpx.delete(f"{d.url}/v1/runs/{run['id']}", headers=d.auth_headers(), timeout=10)
    assert r.status_code == 200 and r.json()["status"] == "cancelled"
    assert d.get(f"/v1/programs/{run['program_id']}").json()["status"] == "STOPPED"


def test_agentctl_submit_follow(d: DaemonProcess) -> None:
    from console import agentctl

    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command")
    add_workflow_parser(sub, lambda p: agentctl._common(p, suppress=False))
    args = parser.parse_args(["submit", str(EXAMPLES / "router"), "--args",
                              '{"request": "hello there"}', "--follow", "--json",
                              "--url", d.url, "--token", d.token])
    from console.client import AgentdClient

    with AgentdClient(args.url, args.token) as client:
        assert args.tui_command(client, args) == 0
    bad = parser.parse_args(["submit", str(EXAMPLES / "router"), "--args", '{"nope": 1}',
                             "--url", d.url, "--token", d.token])
    from console.client import ClientError

    with AgentdClient(bad.url, bad.token) as client, pytest.raises(ClientError,
                                                                   match="unknown argument"):
        bad.tui_command(client, bad)


HOL_SRC = '''import time

import agentd
from agentd import runtime


@agentd.agent(min_instances=2, max_instances=2)
class Worker:
    def work(self, i: int, delay: float) -> int:
        time.sleep(delay)  # a call that takes a while, so that the next ones queue
        return i


def main(n: int = 6, delay: float = 1.0) -> list[int]:
    w = Worker()
    assert w.instances == 2  # registers the agent: its local controllers report from now
    control = runtime.current().control
    while not control.snapshot()["rules"]["weights"]:
        time.sleep(0.05)  # until the operator's route has reached this process
    futures = [w.work(i, delay) for i in range(n)]
    return [int(f) for f in futures]
'''


def test_global_controller_migrates_head_of_line_calls(d: DaemonProcess) -> None:
    """An operator routes every call to Worker#0; the head-of-line policy, running in
    the daemon's global loop, moves queued calls to the idle Worker#1. Each call runs
    once, results are intact, and placement, migration and every decision are traced."""
    r = httpx.put(f"{d.url}/v1/control/policy", json={"name": "hol-migration"},
                  headers=d.auth_headers(), timeout=10)
    assert r.status_code == 200 and r.json()["policy"] == "hol-migration", r.text
    try:
        assert register(d, "hol", {"main.py": HOL_SRC}).status_code == 201
        run = d.post("/v1/runs", json={"workflow": "hol", "session_id": "s-hol"}).json()
        wait_for(lambda: d.get(f"/v1/runs/{run['id']}/control").json()["reported"], 20,
                 "the sandbox to report its view")
        view = d.get(f"/v1/runs/{run['id']}/control").json()
        assert sorted(i["instance_id"] for i in view["instances"]) == ["Worker#0", "Worker#1"]
        route = {"kind": "WeightedRoute", "agent_type": "Worker", "instances": ["Worker#0"],
                 "weights": [1.0], "reason": "test: everything to one instance"}
        r = d.post(f"/v1/runs/{run['id']}/control/decisions", json={"decisions": [route]})
        assert r.status_code == 200 and r.json()["results"][0]["ok"], r.text
        bad = d.post(f"/v1/runs/{run['id']}/control/decisions",
                     json={"decisions": [{"kind": "Teleport"}]})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "decisions"
        assert "Teleport" in bad.json()["error"]["message"]
        refused = d.post(f"/v1/runs/{run['id']}/control/decisions",
                         json={"decisions": [{"kind": "Kill", "instance_id": "Worker#7"}]})
        assert refused.json()["results"][0]["reason"] == "instance 'Worker#7' is not alive"
        final = d.run_ended(run["id"], 30)
        assert final["status"] == "finished", final
        assert final["result"] == list(range(6))
    finally:
        httpx.put(f"{d.url}/v1/control/policy", json={"name": "nalar-default"},
                  headers=d.auth_headers(), timeout=10)
    events = wait_for_trace(d, "s-hol", "run.finished")

    def of(kind: str) -> list[dict[str, Any]]:
        return [e["data"] for e in events if e["kind"] == kind]

    applied = [e for e in of("control.applied") if e["decision"] == "WeightedRoute"]
    assert applied and applied[0]["ok"]
    placed = {e["id"]: e for e in of("future.placed")}
    assert len(placed) == 6 and {e["instance"] for e in placed.values()} == {"Worker#0"}
    assert all(e["reason"] == "weighted route" for e in placed.values())
    migrated = of("future.migrated")
    assert migrated, [e for e in events if e["kind"].startswith(("control", "migration"))]
    assert all((m["source"], m["destination"]) == ("Worker#0", "Worker#1") for m in migrated)
    started = [e["id"] for e in of("future.started")]
    assert sorted(started) == sorted(placed)  # every call ran, and exactly once
    on_w1 = {e["id"] for e in of("future.started") if e["instance"] == "Worker#1"}
    assert on_w1 == {m["id"] for m in migrated}
    decisions = of("control.decision")
    assert any(e["by"] == "hol-migration" and e["decision_kind"] == "Migrate" and e["ok"]
               for e in decisions)
    assert any(e["by"] == "operator" and not e["ok"] for e in decisions)
    rows = d.get("/v1/sessions/s-hol/trace", params={"limit": 1000}).json()["data"]
    assert {r["kind"] for r in rows} >= {"future.placed", "future.migrated", "control.decision"}


def test_control_policy_endpoint_names_bad_input(d: DaemonProcess) -> None:
    r = httpx.put(f"{d.url}/v1/control/policy", json={"name": "fastest"},
                  headers=d.auth_headers(), timeout=10)
    assert r.status_code == 400 and r.json()["error"]["param"] == "name"
    assert "unknown control policy" in r.json()["error"]["message"]
    status = d.get("/v1/control").json()
    assert status["policy"] == "nalar-default" and "srtf-stage" in status["policies"]
