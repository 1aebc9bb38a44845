"""Worker death mid-stream and daemon restarts, with real processes."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import openai

from console.workflow_cmd import read_bundle
from tests.daemon_process import DaemonProcess

MODEL = "sim-llama3-8b"
ROUTER = Path(__file__).resolve().parents[2] / "examples" / "router"


def test_stream_survives_sigkill_of_its_worker(daemon_factory) -> None:  # type: ignore[no-untyped-def]
    # time_scale 3 slows the modelled H100 down so 300 tokens take a few seconds.
    d: DaemonProcess = daemon_factory(workers=2, env={"AGENTD_SIM_TIME_SCALE": "3"}).start()
    client = openai.OpenAI(base_url=f"{d.url}/v1", api_key=d.token, max_retries=0)
    stream = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "long answer"}], max_tokens=300,
        stream=True, stream_options={"include_usage": True},
        extra_body={"program_id": "p-fo", "session_id": "s-fo"},
    )
    pieces: list[str] = []
    killed = None
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            pieces.append(chunk.choices[0].delta.content)
        if killed is None and len(pieces) >= 20:
            worker_id = d.get("/v1/programs/p-fo").json()["worker_id"]
            [worker] = [w for w in d.get("/v1/workers").json()["data"] if w["id"] == worker_id]
            os.kill(worker["pid"], signal.SIGKILL)
            killed = worker["pid"]
        if chunk.usage is not None:
            assert chunk.usage.completion_tokens == 300
    words = "".join(pieces).split()
    assert len(words) == 300
    assert killed is not None
    program = d.get("/v1/programs/p-fo").json()
    # It finished on a live process: the other worker, or the killed one's restart.
    [finisher] = [w for w in d.get("/v1/workers").json()["data"]
                  if w["id"] == program["worker_id"]]
    assert finisher["pid"] != killed and finisher["status"] == "healthy"
    [req] = program["requests"]
    assert req["failovers"] == 1 and req["status"] == "finished"
    kinds = [e["kind"] for e in d.get("/v1/sessions/s-fo/trace").json()["data"]]
    assert kinds.index("request.failover") < kinds.index("request.finished")
    assert kinds.count("request.dispatched") == 2


def test_request_fails_clearly_when_no_worker_is_left(daemon_factory) -> None:  # type: ignore[no-untyped-def]
    d: DaemonProcess = daemon_factory(workers=1, env={"AGENTD_SIM_TIME_SCALE": "3"}).start()
    client = openai.OpenAI(base_url=f"{d.url}/v1", api_key=d.token, max_retries=0)
    stream = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "long answer"}], max_tokens=2000,
        stream=True, extra_body={"program_id": "p-dead"},
    )
    error = None
    try:
        for i, _chunk in enumerate(stream):
            if i == 5:
                [worker] = d.get("/v1/workers").json()["data"]
                os.kill(worker["pid"], signal.SIGKILL)
    except openai.APIError as exc:
        error = str(exc)
    assert error is not None and "no healthy worker left" in error
    [req] = d.get("/v1/programs/p-dead").json()["requests"]
    assert req["status"] == "failed" and "no healthy worker" in req["error"]


def test_restart_keeps_sessions_programs_and_traces(daemon_factory) -> None:  # type: ignore[no-untyped-def]
    d: DaemonProcess = daemon_factory(workers=1).start()
    client = openai.OpenAI(base_url=f"{d.url}/v1", api_key=d.token, max_retries=0)
    client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "remember me"}], max_tokens=3,
        extra_body={"program_id": "p-keep", "session_id": "s-keep"},
    )
    before = d.get("/v1/sessions/s-keep/trace").json()["data"]
    assert d.stop() == 0
    d.start()
    program = d.get("/v1/programs/p-keep").json()
    assert program["status"] == "ACTING" and program["requests"][0]["output_tokens"] == 3
    after = d.get("/v1/sessions/s-keep/trace").json()["data"]
    assert after[: len(before)] == before
    # The program continues after the restart, and its trace grows.
    client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "still here"}], max_tokens=2,
        extra_body={"program_id": "p-keep"},
    )
    assert d.get("/v1/programs/p-keep").json()["steps"] == 2
    assert d.get("/v1/sessions/s-keep").json()["programs"][0]["id"] == "p-keep"


def test_restart_keeps_a_sessions_managed_state_and_the_workflow(daemon_factory) -> None:  # type: ignore[no-untyped-def]
    d: DaemonProcess = daemon_factory(workers=1).start()
    bundle = {"name": "router", "files": read_bundle(ROUTER), "entry": "main:main"}
    assert d.post("/v1/workflows", json=bundle).status_code == 201

    def turn(request: str) -> dict[str, Any]:
        view = d.run_to_end({"workflow": "router", "session_id": "s-managed",
                             "args": {"request": request}})
        assert view["status"] == "finished", view
        result: dict[str, Any] = view["result"]
        return result

    assert turn("how are you today?")["turns"] == "1"
    assert d.stop() == 0
    d.start()
    # The router counts its turns in a ManagedList bound to the session: the count goes on
    # from the stored state, and the registered workflow is still there to run.
    assert turn("and now?")["turns"] == "2"


def test_sigterm_stops_workers_and_flushes(daemon_factory) -> None:  # type: ignore[no-untyped-def]
    d: DaemonProcess = daemon_factory(workers=2).start()
    pids = [w["pid"] for w in d.get("/v1/workers").json()["data"]]
    t0 = time.time()
    assert d.stop() == 0
    assert time.time() - t0 < 10
    for pid in pids:
        try:
            os.kill(pid, 0)
            alive = True
        except ProcessLookupError:
            alive = False
        assert not alive, f"worker {pid} outlived the daemon"
