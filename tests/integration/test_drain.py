"""`agentd stop --drain` against a real daemon with a long stream in flight."""

from __future__ import annotations

import contextlib
import json
import sqlite3
import subprocess
import threading
import time
from typing import Any

import httpx
import openai

from tests.daemon_process import DaemonProcess
from tests.waiting import wait_for

MODEL = "sim-llama3-8b"


def _stream(d: DaemonProcess, program: str, max_tokens: int) -> Any:
    client = openai.OpenAI(base_url=f"{d.url}/v1", api_key=d.token, max_retries=0)
    return client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "long"}], max_tokens=max_tokens,
        stream=True, stream_options={"include_usage": True}, extra_body={"program_id": program})


def _stop_in_background(d: DaemonProcess, *args: str) -> tuple[threading.Thread, list[Any]]:
    out: list[subprocess.CompletedProcess[str]] = []
    thread = threading.Thread(target=lambda: out.append(d.cli("stop", *args)), daemon=True)
    thread.start()
    return thread, out


def _wait_refused(d: DaemonProcess) -> httpx.Response:
    """Poll with new requests until the drain refuses them (it starts within a second)."""
    def refused() -> httpx.Response | None:
        r = d.post("/v1/chat/completions", json={
            "model": MODEL, "messages": [{"role": "user", "content": "new"}], "max_tokens": 1})
        assert r.status_code in (200, 503), r.text
        return r if r.status_code == 503 else None

    answer: httpx.Response = wait_for(refused, 15, "the drain to refuse a new request",
                                      interval=0.05)
    return answer


def _trace_kinds(d: DaemonProcess) -> list[tuple[str, dict[str, Any]]]:
    with contextlib.closing(sqlite3.connect(f"file:{d.data_dir / 'agentd.db'}?mode=ro",
                                            uri=True)) as db:
        rows = db.execute("SELECT kind, data FROM trace_events WHERE kind LIKE 'daemon.%' "
                          "ORDER BY id").fetchall()
    return [(kind, json.loads(data)) for kind, data in rows]


def test_drain_lets_the_stream_finish_refuses_new_work_and_exits_0(daemon_factory) -> None:  # type: ignore[no-untyped-def]
    d: DaemonProcess = daemon_factory(workers=1, env={"AGENTD_SIM_TIME_SCALE": "3"}).start()
    assert (d.data_dir / "daemon.pid").read_text().split()[0] == str(d.proc.pid if d.proc else 0)
    stream = _stream(d, "p-drain", 300)
    pieces: list[str] = []
    stopper = None
    usage = None
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            pieces.append(chunk.choices[0].delta.content)
        if stopper is None and len(pieces) == 5:
            stopper = _stop_in_background(d, "--drain", "--deadline", "60")
            refused = _wait_refused(d)
            assert refused.headers["retry-after"] == "5"
            error = refused.json()["error"]
            assert error["code"] == "draining" and "draining for shutdown" in error["message"]
        usage = chunk.usage or usage
    assert stopper is not None
    assert len("".join(pieces).split()) == 300
    assert usage is not None and usage.completion_tokens == 300
    assert d.proc is not None and d.proc.wait(30) == 0
    stopper[0].join(30)
    [done] = stopper[1]
    assert done.returncode == 0 and "drained and stopped" in done.stdout, done.stderr
    assert not (d.data_dir / "daemon.pid").exists()
    kinds = _trace_kinds(d)
    assert [k for k, _ in kinds][-3:] == ["daemon.draining", "daemon.drained", "daemon.stopped"]
    assert kinds[-2][1]["aborted"] == 0


def test_drain_deadline_aborts_what_is_left_with_a_reason(daemon_factory) -> None:  # type: ignore[no-untyped-def]
    d: DaemonProcess = daemon_factory(workers=1, env={"AGENTD_SIM_TIME_SCALE": "3"}).start()
    stream = _stream(d, "p-late", 4000)
    error = None
    t0 = 0.0
    try:
        for n, _chunk in enumerate(stream):
            if n == 3:
                t0 = time.time()
                stopper = _stop_in_background(d, "--drain", "--deadline", "1")
    except openai.APIError as exc:
        error = str(exc)
    assert error is not None and "drain deadline of 1s passed" in error, error
    assert time.time() - t0 < 10
    assert d.proc is not None and d.proc.wait(30) == 0
    stopper[0].join(30)
    assert stopper[1][0].returncode == 0
    kinds = _trace_kinds(d)
    assert kinds[-2][0] == "daemon.drained" and kinds[-2][1]["aborted"] == 1
    d.start()  # the aborted request is stored with its reason
    [req] = d.get("/v1/programs/p-late").json()["requests"]
    assert req["status"] == "aborted" and "drain deadline" in req["error"]


def test_drain_refuses_new_runs_and_still_lists_them(daemon_factory) -> None:  # type: ignore[no-untyped-def]
    d: DaemonProcess = daemon_factory(workers=1, env={"AGENTD_SIM_TIME_SCALE": "3"}).start()
    assert d.post("/v1/workflows", json={"name": "one", "files": {
        "main.py": "def main():\n    return 1\n"}, "entry": "main:main"}).status_code == 201
    done = d.run_to_end({"workflow": "one"})
    stream = _stream(d, "p-drain-runs", 4000)
    next(iter(stream))  # a request in flight holds the drain open
    assert d.post("/v1/admin/drain", json={"deadline_s": 60}).status_code == 202
    refused = d.post("/v1/runs", json={"workflow": "one"})
    assert refused.status_code == 503, refused.text
    assert refused.headers["retry-after"] == "5" and refused.json()["error"]["code"] == "draining"
    listed = d.get("/v1/runs")
    assert listed.status_code == 200
    assert [v["id"] for v in listed.json()["data"]] == [done["id"]]
    assert d.get(f"/v1/runs/{done['id']}").json()["status"] == "finished"
    stream.close()
