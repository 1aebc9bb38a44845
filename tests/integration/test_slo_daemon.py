"""The SLO scheduling stack in a real daemon: the meta loop switches the ordering policy
under a burst and the trace says why; operator ordering policies swap in and roll back
under steady traffic without dropping a request."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.daemon_process import DaemonProcess
from tests.integration.test_policies import Traffic
from tests.waiting import wait_for

MODEL = "sim-llama3-8b"
LONG_TOKENS = 2500
# Sim KV of 12288 tokens: the fence (90% of it) holds four long requests (prompt plus a
# 2500-token bound each) and not a fifth, so a burst queues behind the fifth under FCFS.
# The four take about 7 s (modelled), far past the 4 s TTFT SLO of the short questions.
BURST_CONFIG = """\
kv_policy = "vllm-default"
sim_kv_tokens = 12288
sim_time_scale = 0.3
meta_interval_s = 1.0

[slo]
cycle_s = 0.25

# The burst violates most TTFT SLOs by design; these keep the anomaly rule and the
# emergency bypass out of the way so the head-of-line rule is the one that fires.
[slo.rules]
anomaly_violation = 0.99
min_completions = 10

[slo.guard]
bypass_violation = 1.01
"""
OPERATOR_CONFIG = """\
kv_policy = "vllm-default"
meta_policy = "off"
"""
LONGEST_FIRST = '''\
from scheduling.slo.ordering import KeyedPolicy


class LongestFirst(KeyedPolicy):
    name = "longest-first"

    def key(self, request):
        return (-request.t_tot,)
'''
BOOM = '''\
from scheduling.slo.ordering import Fcfs

ARM_AT = {arm_at}


class Boom(Fcfs):
    name = "boom-order"

    def push(self, request, now):
        if now > ARM_AT:
            raise RuntimeError("boom after arming")
        super().push(request, now)
'''


def configured(daemon_factory: Any, tmp_path: Path, config: str, **kw: Any) -> DaemonProcess:
    path = tmp_path / "agentd.toml"
    path.write_text(config)
    return daemon_factory(extra_args=["--config", str(path)], **kw).start()  # type: ignore[no-any-return]


def put(d: DaemonProcess, path: str, **kw: Any) -> httpx.Response:
    return httpx.put(f"{d.url}{path}", headers=d.auth_headers(), timeout=30, **kw)


def scheduling_events(d: DaemonProcess, kind: str) -> list[dict[str, Any]]:
    return list(d.get("/v1/scheduling/trace", params={"kind": kind}).json()["data"])


async def burst(d: DaemonProcess) -> list[Any]:
    client = openai.AsyncOpenAI(base_url=f"{d.url}/v1", api_key=d.token, max_retries=0,
                                timeout=120)

    def ask(text: str, tokens: int, n: int) -> Any:
        return client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": text}], max_tokens=tokens,
            extra_body={"session_id": f"burst-{n}"})

    longs = [asyncio.create_task(ask("Write a long story about a dragon.", LONG_TOKENS, n))
             for n in range(5)]
    # The shorts arrive once the longs hold the fence and the fifth waits at the head.
    await asyncio.to_thread(wait_for, lambda: d.get("/v1/scheduling").json()["queued"] == 1,
                            30, "the fifth long request to queue")
    shorts = [ask(f"What is the capital of country {n}?", 8, 100 + n) for n in range(24)]
    return list(await asyncio.gather(*longs, *shorts))


def test_burst_switches_ordering_and_the_trace_says_why(daemon_factory, tmp_path) -> None:  # type: ignore[no-untyped-def]
    d = configured(daemon_factory, tmp_path, BURST_CONFIG)
    before = d.get("/v1/scheduling").json()
    assert before["policies"]["ordering"] == {"name": "fcfs", "version": 1}
    assert before["policies"]["meta"]["name"] == "meta-rules"

    answers = asyncio.run(burst(d))
    assert len(answers) == 29 and all(a.choices[0].message.content for a in answers)

    switch = wait_for(lambda: scheduling_events(d, "ordering.switch"), 15, "a switch")[0]
    data = switch["data"]
    assert (data["policy"], data["previous"]) == ("two_lane", "fcfs")
    assert data["reason"].startswith("HOL blocking: length CV"), data["reason"]
    assert (data["meta"], data["meta_version"]) == ("meta-rules", 1)
    # The policy's own page lists the switch into it too.
    assert (switch["id"], "ordering.switch", data) in [
        (e["id"], e["kind"], e["data"]) for e in d.get("/v1/policies/two_lane").json()["events"]]
    status = d.get("/v1/scheduling").json()
    assert status["policies"]["ordering"]["name"] == "two_lane"
    assert status["counters"]["switches"] >= 1 and status["counters"]["refusals"] >= 1
    assert status["window"]["ttft_compliance"] < 0.5  # the shorts waited behind the longs

    # The fifth long request was held by the fence: its session trace says so and why.
    held = [e for n in range(5)
            for e in d.get(f"/v1/sessions/burst-{n}/trace").json()["data"]
            if e["kind"] == "admission.refused"]
    assert held and "KV fence" in held[0]["data"]["reason"]
    assert held[0]["data"]["policy"] == "statera"
    # Requests carry the ordering policy they were dispatched under.
    dispatched = [e for e in d.get("/v1/sessions/burst-100/trace").json()["data"]
                  if e["kind"] == "request.dispatched"]
    assert dispatched[0]["data"]["ordering"] == "fcfs"

    metrics = d.get("/metrics").text
    assert 'agentd_scheduling_policy{layer="ordering",policy="two_lane",version="1"} 1' in metrics
    assert "agentd_ordering_switches_total 1" in metrics
    assert 'agentd_slo_requests_total{outcome="missed"}' in metrics
    for family in ("agentd_slo_goodput_rps", "agentd_slo_attainment", "agentd_slo_esg_ratio",
                   "agentd_slo_ttft_compliance", "agentd_slo_tpot_compliance"):
        assert f"\n{family} " in metrics, family


@pytest.fixture
def operator_daemon(daemon_factory, tmp_path) -> DaemonProcess:  # type: ignore[no-untyped-def]
    return configured(daemon_factory, tmp_path, OPERATOR_CONFIG, workers=2)


def test_operator_ordering_policy_swaps_in_under_load(operator_daemon: DaemonProcess) -> None:
    d = operator_daemon
    with Traffic(d) as load:
        load.serves()
        r = put(d, "/v1/policies/longest-first", json={"layer": "ordering",
                                                       "source": LONGEST_FIRST})
        assert r.status_code == 201 and r.json()["validation"]["ok"], r.text
        r = d.post("/v1/policies/longest-first/validate")
        report = r.json()["validation"]
        assert r.status_code == 200 and report["ok"] and report["snapshots"] == ["live", "sample"]
        r = d.post("/v1/policies/longest-first/activate")
        assert r.status_code == 200, r.text
        assert r.json()["active"] == {"name": "longest-first", "version": 1}
        served_before = load.ok
        load.serves()  # under the new policy
    assert not load.errors, load.errors[:3]
    assert load.ok > served_before > 0
    status = d.get("/v1/scheduling").json()
    assert status["policies"]["ordering"] == {"name": "longest-first", "version": 1}
    assert status["queued"] == 0 and status["parked"] == 0
    [activated] = [e for e in scheduling_events(d, "policy.activated")
                   if e["data"]["name"] == "longest-first"]
    assert activated["data"]["layer"] == "ordering"
    # Rollback by the operator restores the built-in that ran before.
    r = d.post("/v1/policies/longest-first/rollback")
    assert r.json()["active"] == {"name": "fcfs", "version": 1}


def test_raising_ordering_policy_rolls_back_within_a_tick(operator_daemon: DaemonProcess) -> None:
    d = operator_daemon
    with Traffic(d) as load:
        load.serves()
        # Armed from a moment on (time passing is the trigger): it passes validation first.
        arm_at = time.time() + 2.0
        r = put(d, "/v1/policies/boom-order", json={
            "layer": "ordering", "source": BOOM.format(arm_at=arm_at)})
        assert r.json()["validation"]["ok"], r.text
        assert d.post("/v1/policies/boom-order/activate").status_code == 200
        [rolled] = wait_for(lambda: [e for e in scheduling_events(d, "policy.rolled_back")
                                     if e["data"]["name"] == "boom-order"], 15, "the rollback")
        load.serves()  # under the restored built-in
    assert not load.errors, load.errors[:3]
    data = rolled["data"]
    assert data["layer"] == "ordering" and data["automatic"] is True
    assert "RuntimeError: boom after arming" in data["reason"]
    assert (data["restored"], data["restored_version"]) == ("fcfs", 1)
    # The first request queued after arming trips it; traffic runs many per second.
    assert float(rolled["ts"]) - arm_at < 1.0
    status = d.get("/v1/scheduling").json()
    assert status["policies"]["ordering"] == {"name": "fcfs", "version": 1}
    boom = d.get("/v1/policies/boom-order").json()
    assert boom["versions"][0]["status"] == "rolled_back" and boom["active_version"] is None
