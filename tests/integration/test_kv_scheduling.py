"""Program-aware KV scheduling in a real daemon: pauses, restores and operator migration."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable

import openai
import pytest

from tests.daemon_process import DaemonProcess

MODEL = "sim-llama3-8b"
SYSTEM = "You are a coding agent working in a repository. " * 40  # about 400 tokens


async def agent_loop(client: openai.AsyncOpenAI, n: int, steps: int, rng: random.Random) -> int:
    history = [{"role": "system", "content": SYSTEM},
               {"role": "user", "content": f"task {n}: fix the failing test"}]
    pid = f"agent-{n}"
    for step in range(steps):
        resp = await client.chat.completions.create(
            model=MODEL, messages=history, max_tokens=16,  # type: ignore[arg-type]
            extra_body={"program_id": pid, "session_id": f"s-{n}"},
        )
        history += [{"role": "assistant", "content": resp.choices[0].message.content or ""},
                    {"role": "user", "content": f"tool result {step}: " + "ok " * 30}]
        await asyncio.sleep(rng.uniform(0.2, 0.8))  # the tool's own time: the load, not a wait
    return n


@pytest.fixture
def kv_daemon(daemon_factory: Callable[..., DaemonProcess]) -> DaemonProcess:
    # Two workers with 6k tokens of KV each: 50 programs of ~600 tokens must take turns.
    return daemon_factory(workers=2, env={"AGENTD_SIM_KV_TOKENS": "6144",
                                          "AGENTD_KV_POLICY": "thunderagent"}).start()


def test_fifty_agents_pause_restore_and_finish(kv_daemon: DaemonProcess) -> None:
    d = kv_daemon

    async def run() -> list[int]:
        client = openai.AsyncOpenAI(base_url=f"{d.url}/v1", api_key=d.token, max_retries=0,
                                    timeout=120)
        rng = random.Random(7)
        return await asyncio.gather(*(agent_loop(client, n, 4, rng) for n in range(50)))

    assert sorted(asyncio.run(run())) == list(range(50))
    paused_programs = set()
    for n in range(50):
        events = d.get(f"/v1/sessions/s-{n}/trace", params={"limit": 5000}).json()["data"]
        statuses = [e["data"]["new"] for e in events if e["kind"] == "program.status"]
        # All four requests finished, so every pause before the last one ended with the
        # program running again; a pause after its last request (idle, holding KV others
        # want, not released yet) is the policy's to make.
        assert sum(e["kind"] == "request.finished" for e in events) == 4
        if "PAUSED" in statuses and "REASONING" in statuses[statuses.index("PAUSED"):]:
            paused_programs.add(n)
    assert paused_programs, "no program was paused mid-run: KV pressure did not build up"
    kinds = {e["kind"] for n in paused_programs
             for e in d.get(f"/v1/sessions/s-{n}/trace").json()["data"]}
    assert {"kv.pause", "kv.restore"} <= kinds
    for n in range(50):
        assert d.post(f"/v1/programs/agent-{n}/release").json()["status"] == "STOPPED"
    assert d.get("/v1/programs", params={"status": "PAUSED"}).json()["total"] == 0


def test_operator_migrates_a_session(kv_daemon: DaemonProcess) -> None:
    d = kv_daemon
    client = openai.OpenAI(base_url=f"{d.url}/v1", api_key=d.token, max_retries=0)
    client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "first step"}], max_tokens=4,
        extra_body={"program_id": "p-move", "session_id": "s-move"})
    source = d.get("/v1/programs/p-move").json()["worker_id"]
    [target] = [w["id"] for w in d.get("/v1/workers").json()["data"] if w["id"] != source]
    r = d.post("/v1/sessions/s-move/migrate", json={"worker_id": target})
    assert r.status_code == 200, r.text
    [moved] = r.json()["data"]
    assert moved["from"] == source and moved["to"] == target
    assert moved["recompute_tokens"] > 0
    client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "second step"}], max_tokens=4,
        extra_body={"program_id": "p-move"})
    program = d.get("/v1/programs/p-move").json()
    assert program["worker_id"] == target and program["pinned"] is True
    assert program["requests"][-1]["worker_id"] == target
    [event] = [e for e in d.get("/v1/sessions/s-move/trace").json()["data"]
               if e["kind"] == "program.migrated"]
    assert event["data"]["source"] == source and event["data"]["target"] == target


def test_migrate_refuses_unknown_worker_and_needs_operator(kv_daemon: DaemonProcess) -> None:
    d = kv_daemon
    openai.OpenAI(base_url=f"{d.url}/v1", api_key=d.token, max_retries=0).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "x"}], max_tokens=2,
        extra_body={"program_id": "p-stay"})
    r = d.post("/v1/programs/p-stay/migrate", json={"worker_id": "nowhere"})
    assert r.status_code == 404 and "nowhere" in r.json()["error"]["message"]
    r = d.post("/v1/programs/p-stay/migrate", json={"target": "x"})
    assert r.status_code == 400


def test_operator_pause_and_resume(kv_daemon: DaemonProcess) -> None:
    d = kv_daemon
    client = openai.OpenAI(base_url=f"{d.url}/v1", api_key=d.token, max_retries=0, timeout=10)
    client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "x"}], max_tokens=2,
        extra_body={"program_id": "p-hold"})
    r = d.post("/v1/programs/p-hold/pause")
    assert r.status_code == 200 and r.json()["status"] == "PAUSED"
    with pytest.raises(openai.APITimeoutError):
        client.with_options(timeout=1.5).chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "y"}], max_tokens=2,
            extra_body={"program_id": "p-hold"})
    assert d.post("/v1/programs/p-hold/resume").json()["held"] is False
    assert d.post("/v1/programs/p-hold/kill").json()["status"] == "FAILED"
