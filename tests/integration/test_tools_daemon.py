"""Tools through the daemon: exec over REST, release at program end, declared tools
prepared while the program waits, orphans reclaimed after a crash."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.daemon_process import DaemonProcess
from tests.waiting import wait_for

MODEL = "sim-llama3-8b"


def config_file(tmp: Path, setup_s: float = 0.0) -> Path:
    path = tmp / "agentd.toml"
    setup = f'setup = ["sleep {setup_s}"]' if setup_s else ""
    path.write_text(f"""
[tools.shell]
backend = "process"
command = []
exec_timeout_s = 10
{setup}
""")
    return path


@pytest.fixture
def tool_daemon(daemon_factory: Callable[..., DaemonProcess],
                tmp_path: Path) -> DaemonProcess:
    cfg = config_file(tmp_path, setup_s=1.5)
    return daemon_factory(workers=1, extra_args=["--config", str(cfg)]).start()


def chat(d: DaemonProcess, program: str, session: str | None = None) -> None:
    openai.OpenAI(base_url=f"{d.url}/v1", api_key=d.token, max_retries=0).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "run the tests"}], max_tokens=2,
        extra_body={"program_id": program, "session_id": session or program})


def test_exec_round_trip_and_release_removes_everything(tool_daemon: DaemonProcess) -> None:
    d = tool_daemon
    chat(d, "p-tool", "s-tool")
    r = d.post("/v1/programs/p-tool/tools/shell/exec",
               json={"command": "echo hello > f.txt; cat f.txt; exit 3"})
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["exit_code"] == 3 and out["stdout"].strip() == "hello" and out["reason"] == "exit"
    r = d.post("/v1/programs/p-tool/tools/shell/exec", json={"command": "sleep 5",
                                                              "timeout_s": 0.5})
    assert r.json()["reason"] == "timeout"
    owned = [t for t in d.get("/v1/tools").json()["data"] if t.get("program_id") == "p-tool"]
    assert owned
    assert d.post("/v1/programs/p-tool/release").status_code == 200
    wait_for(lambda: not [t for t in d.get("/v1/tools").json()["data"]
                          if t.get("program_id") == "p-tool"], 10, "p-tool's tools to go")
    kinds = [e["kind"] for e in d.get("/v1/sessions/s-tool/trace").json()["data"]]
    assert {"tool.exec.start", "tool.exec.end", "tool.release"} <= set(kinds)


def test_killed_program_loses_its_tools(tool_daemon: DaemonProcess) -> None:
    d = tool_daemon
    chat(d, "p-kill")
    r = d.post("/v1/programs/p-kill/tools/shell/exec", json={"command": "echo x > f"})
    assert r.status_code == 200 and r.json()["reason"] == "ok"
    assert d.get("/v1/tools", params={"program_id": "p-kill"}).json()["data"]
    assert d.post("/v1/programs/p-kill/kill").json()["status"] == "FAILED"
    # Rows without a program are backends that could not be asked (no Docker here).
    wait_for(lambda: not [t for t in d.get("/v1/tools", params={"program_id": "p-kill"}).json()[
        "data"] if t.get("program_id") == "p-kill"], 10, "the killed program's tools to go")
    r = d.post("/v1/programs/p-kill/tools/shell/exec", json={"command": "true"})
    assert r.status_code == 409


def test_tool_errors_are_structured(tool_daemon: DaemonProcess) -> None:
    d = tool_daemon
    chat(d, "p-err")
    r = d.post("/v1/programs/p-err/tools/nope/exec", json={"command": "true"})
    assert r.status_code == 404 and "nope" in r.json()["error"]["message"]
    r = d.post("/v1/programs/p-err/tools/shell/exec", json={"command": ""})
    assert r.status_code == 400
    r = d.post("/v1/programs/missing/tools/shell/exec", json={"command": "true"})
    assert r.status_code == 404


def test_declared_tool_prepares_while_waiting(tool_daemon: DaemonProcess) -> None:
    d = tool_daemon
    r = d.post("/v1/programs/p-early/tools", json={"tools": ["shell"]})
    assert r.status_code == 200, r.text
    t0 = time.time()
    chat(d, "p-early")  # queued → preparation starts now, overlapping the LLM call
    # The program "reasons" about as long as setup takes: a client that takes its time is
    # what is tested (the setup hides behind it), not a wait for the daemon.
    time.sleep(1.6)
    t1 = time.time()
    r = d.post("/v1/programs/p-early/tools/shell/exec", json={"command": "echo ready"})
    waited = r.json()["duration_s"]
    assert r.json()["stdout"].strip() == "ready"
    assert time.time() - t1 < 1.0, f"setup was not hidden (exec took {waited}s, since {t0})"
    kinds = [e["kind"] for e in d.get("/v1/sessions/p-early/trace").json()["data"]]
    assert kinds.index("tool.prepare.start") < kinds.index("request.finished")


def test_orphans_reclaimed_after_daemon_crash(daemon_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    cfg = config_file(tmp_path)
    d: DaemonProcess = daemon_factory(workers=1, extra_args=["--config", str(cfg)]).start()
    chat(d, "p-orphan")
    assert d.post("/v1/programs/p-orphan/tools/shell/exec",
                  json={"command": "echo x > data"}).status_code == 200
    tools_dir = d.data_dir / "tools"
    assert any(tools_dir.rglob("data"))
    d.kill()  # SIGKILL: no release happens
    d._reap_group()
    # The program is marked stopped while the daemon is down (an operator's release).
    import sqlite3
    con = sqlite3.connect(d.data_dir / "agentd.db")
    con.execute("UPDATE programs SET status='STOPPED' WHERE id='p-orphan'")
    con.commit()
    con.close()
    d.start()
    assert not any(tools_dir.rglob("data"))
    assert not [t for t in d.get("/v1/tools").json()["data"] if t.get("program_id") == "p-orphan"]


def test_a_tool_run_through_agentd_drives_the_programs_kv_acting_time(
        tool_daemon: DaemonProcess) -> None:
    """The KV view of a program whose tool agentd runs: ACTING from the tool's start (not
    from when its request ended), known to be in its tool until it ends, then its measured
    duration is its tool-time history; the next request starts a new acting period."""
    d = tool_daemon
    chat(d, "p-kv")
    # The client "thinks" before it calls the tool: time that must not count as tool time
    # (asserted below), not a wait for the daemon.
    time.sleep(0.3)
    before = d.get("/v1/programs/p-kv/tools").json()["kv"]
    assert before["status"] == "acting" and not before["tool_running"]
    assert before["tool_last_s"] is None
    done = threading.Event()

    def run_tool() -> None:
        d.post("/v1/programs/p-kv/tools/shell/exec", json={"command": "sleep 1"})
        done.set()

    worker = threading.Thread(target=run_tool)
    worker.start()
    def running_tool() -> dict[str, Any] | None:
        assert not done.is_set(), "the tool ended before it showed as running"
        kv: dict[str, Any] = d.get("/v1/programs/p-kv/tools").json()["kv"]
        return kv if kv["tool_running"] else None

    running = wait_for(running_tool, 5, "the running tool to show", interval=0.05)
    worker.join(30)
    after = d.get("/v1/programs/p-kv/tools").json()["kv"]
    events = d.get("/v1/sessions/p-kv/trace", params={"limit": 1000}).json()["data"]
    start = next(e["data"]["at"] for e in events if e["kind"] == "tool.exec.start")
    end = next(e["data"]["at"] for e in events if e["kind"] == "tool.exec.end")
    assert running["acting_since"] == start > before["acting_since"] + 0.3
    assert (after["acting_since"], after["tool_ended_at"], after["tool_running"]) == (
        start, end, False)
    # The call waited for the 1.5 s setup, then slept 1 s: all of it away from the GPU.
    assert after["tool_last_s"] == pytest.approx(end - start) and after["tool_last_s"] >= 2.4
    assert after["tool_time_mean_s"] == after["tool_last_s"]
    chat(d, "p-kv")
    again = d.get("/v1/programs/p-kv/tools").json()["kv"]
    assert again["acting_since"] > end and again["tool_ended_at"] is None
    assert again["tool_time_mean_s"] == after["tool_last_s"]
