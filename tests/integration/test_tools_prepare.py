"""Asynchronous preparation in a real daemon: a program paused by KV pressure declares a
tool while it waits in the global queue; its environment is ready before it is restored.

One sim worker with 4096 tokens of KV. Programs B (~1.2k tokens) and A (~1.8k) each run a
step: both fit. A's next request grows it to ~3.3k and 300 generated tokens: together they
thrash and the policy pauses B, the shorter ACTING one. B's next request waits while A
generates; during that wait B declares a tool whose setup sleeps SETUP_S. (The KV view
counts a queued request's prompt, so a program that would not fit at arrival is not
admitted at all: the pressure has to come from growth, as it does in an agent.)
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.daemon_process import DaemonProcess
from tests.tool_cleanup import remove_daemon_tools
from tests.waiting import wait_for

MODEL = "sim-llama3-8b"
SETUP_S = 1.5


def _config(tmp: Path, backend: str, image: str | None) -> Path:
    path = tmp / "agentd.toml"
    where = f'image = "{image}"' if image else ""
    path.write_text(f'[tools.env]\nbackend = "{backend}"\n{where}\nsetup = ["sleep {SETUP_S}"]\n')
    return path


@pytest.fixture(params=["process", "docker"])
def paused_daemon(request: pytest.FixtureRequest, daemon_factory: Callable[..., DaemonProcess],
                  tmp_path: Path) -> Iterator[DaemonProcess]:
    image = request.getfixturevalue("busybox_image") if request.param == "docker" else None
    d = daemon_factory(
        workers=1, extra_args=["--config", str(_config(tmp_path, request.param, image))],
        # The sim's steps 3x slower: A's long step (~7 s) outlasts B's preparation (SETUP_S
        # plus the engine's create, slower on a loaded machine) by seconds, not by ~0.3 s.
        env={"AGENTD_SIM_KV_TOKENS": "4096", "AGENTD_KV_POLICY": "thunderagent",
             "AGENTD_SIM_TIME_SCALE": "3"},
    )
    yield d.start()
    if image:
        remove_daemon_tools(d.data_dir)


def _chat(d: DaemonProcess, program: str, words: int, max_tokens: int) -> None:
    client = openai.OpenAI(base_url=f"{d.url}/v1", api_key=d.token, max_retries=0, timeout=60)
    client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "word " * words}],
        max_tokens=max_tokens, extra_body={"program_id": program})


def _trace(d: DaemonProcess, session: str) -> list[dict[str, Any]]:
    data: list[dict[str, Any]] = d.get(f"/v1/sessions/{session}/trace",
                                       params={"limit": 1000}).json()["data"]
    return data


def _queued(d: DaemonProcess, session: str) -> int:
    return sum(e["kind"] == "request.queued" for e in _trace(d, session))


def _first(events: list[dict[str, Any]], kind: str, after: float) -> dict[str, Any]:
    return next(e for e in events if e["kind"] == kind and e["ts"] >= after)


def test_preparation_overlaps_a_paused_programs_wait(paused_daemon: DaemonProcess) -> None:
    d = paused_daemon
    _chat(d, "B", 1200, 2)
    _chat(d, "A", 1800, 2)
    threads = [threading.Thread(target=_chat, args=(d, "A", 3300, 300)),
               threading.Thread(target=_chat, args=(d, "B", 1200, 2))]
    threads[0].start()
    wait_for(lambda: d.get("/v1/programs/B").json()["status"] == "PAUSED", 15, "B to be paused",
             interval=0.05)
    threads[1].start()  # B's request arrives after A's
    wait_for(lambda: _queued(d, "B") == 2, 15, "B's second request to queue", interval=0.05)
    assert d.get("/v1/programs/B").json()["status"] == "PAUSED"
    r = d.post("/v1/programs/B/tools", json={"tools": ["env"]})
    assert r.status_code == 200 and r.json()["tools"] == ["env"], r.text
    threads[1].join(60)  # B's request came back: it was restored and ran
    r = d.post("/v1/programs/B/tools/env/exec", json={"command": "echo ready"})
    assert r.status_code == 200 and r.json()["stdout"] == "ready\n", r.text
    threads[0].join(60)

    events = _trace(d, "B")
    queued = [e for e in events if e["kind"] == "request.queued"][1]
    start = _first(events, "tool.prepare.start", queued["ts"])
    end = _first(events, "tool.prepare.end", start["ts"])
    dispatched = _first(events, "request.dispatched", queued["ts"])
    # The restore that let it run: the policy may record one earlier that the engine's room
    # then held back (thunderagent restores on its view; admission waits for A to finish).
    restore = [e for e in events if e["kind"] == "kv.restore"
               and queued["ts"] <= e["ts"] <= dispatched["ts"]][-1]
    exec_end = _first(events, "tool.exec.end", end["ts"])
    assert end["data"]["ok"] and end["data"]["duration_s"] >= SETUP_S
    # Prepared entirely inside the wait: started while paused, done before it ran.
    assert start["ts"] < end["ts"] < restore["ts"] <= dispatched["ts"], (start, end, restore)
    assert exec_end["data"]["waited_s"] < SETUP_S / 2, exec_end
    statuses = [(e["ts"], e["data"]["new"]) for e in events if e["kind"] == "program.status"]
    assert [s for t, s in statuses if t <= start["ts"]][-1] == "PAUSED"
