"""The LLM meta selector (meta_policy = "meta-llm") in a real daemon with sim workers.

The sim's text is not JSON, so every decision falls back to the rule map and the trace
says why; a call slower than the meta interval leaves the loop deciding on time; a call
past its timeout is aborted; with no worker there is no call at all."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path
from typing import Any

from daemon.slo.llm import INTERNAL_SESSION, LOW_PRIORITY, PROGRAM_PREFIX
from tests.daemon_process import DaemonProcess
from tests.waiting import wait_for

MODEL = "sim-llama3-8b"
INTERVAL_S = 0.5
FAST = f"""\
meta_policy = "meta-llm"
meta_interval_s = {INTERVAL_S}

[slo]
cycle_s = 0.25

[slo.llm]
max_tokens = 16
timeout_s = 10
"""
# 32 tokens at 40x the modelled step time take about 10 s; the timeout cuts each call
# at 2.5 s, five meta intervals.
SLOW = f"""\
meta_policy = "llm"
meta_interval_s = {INTERVAL_S}
sim_time_scale = 40

[slo]
cycle_s = 0.25

[slo.llm]
max_tokens = 32
timeout_s = 2.5
"""


def configured(daemon_factory: Callable[..., DaemonProcess], tmp_path: Path, config: str,
               **kw: Any) -> DaemonProcess:
    path = tmp_path / "agentd.toml"
    path.write_text(config)
    return daemon_factory(extra_args=["--config", str(path)], **kw).start()


def decisions(d: DaemonProcess) -> list[dict[str, Any]]:
    """The meta.llm trace events, oldest first."""
    resp = d.get("/v1/scheduling/trace", params={"kind": "meta.llm", "limit": 5000})
    return list(resp.json()["data"])


def with_outcome(d: DaemonProcess, outcome: str, n: int) -> list[dict[str, Any]]:
    found = [e for e in decisions(d) if e["data"]["outcome"] == outcome]
    return found if len(found) >= n else []


def test_sim_replies_fall_back_to_the_rules_every_time(daemon_factory: Callable[..., DaemonProcess],
                                                       tmp_path: Path) -> None:
    d = configured(daemon_factory, tmp_path, FAST)
    invalid = wait_for(lambda: with_outcome(d, "invalid", 4), 60, "four rejected replies")
    for e in invalid:
        data = e["data"]
        assert data["detail"] == "malformed JSON (JSONDecodeError)", data
        assert data["reason"].startswith("LLM output rejected (malformed JSON"), data
        assert data["reason"].endswith("rules: only 0 completions: keep")
        assert (data["policy"], data["model"]) == ("fcfs", MODEL)
        assert data["latency_s"] > 0 and e["request_id"].startswith("req-")
    # Every decision is traced, and none of them rests on the model's text.
    assert {e["data"]["outcome"] for e in decisions(d)} <= {"pending", "no_worker", "invalid"}

    # The question went through the engine path as the daemon's own low-priority program.
    session = d.get(f"/v1/sessions/{INTERNAL_SESSION}").json()
    assert session["tenant"] == "agentd-internal"
    [program] = session["programs"]
    assert program["id"] == PROGRAM_PREFIX  # one program for every call
    requests = {r["id"]: r for r in d.get(f"/v1/programs/{program['id']}").json()["requests"]}
    asked = requests[invalid[0]["request_id"]]
    assert (asked["priority"], asked["max_tokens"], asked["model"]) == (LOW_PRIORITY, 16, MODEL)
    assert asked["status"] == "finished" and asked["output_tokens"] == 16
    queued = [e for e in d.get(f"/v1/sessions/{INTERNAL_SESSION}/trace").json()["data"]
              if e["kind"] == "request.queued"]
    assert {e["data"]["tenant"] for e in queued} == {"agentd-internal"}
    # ... and it is no tenant's service: the SLO counters and window leave it out.
    status = d.get("/v1/scheduling").json()
    assert status["policies"]["meta"]["name"] == "meta-llm"
    assert status["counters"]["completed"] == 0 and status["window"]["completions"] == 0
    assert status["llm"]["outcomes"]["invalid"] >= 4
    assert 'agentd_meta_llm_decisions_total{outcome="invalid"}' in d.get("/metrics").text


def test_a_slow_call_never_holds_up_the_meta_loop(daemon_factory: Callable[..., DaemonProcess],
                                                   tmp_path: Path) -> None:
    d = configured(daemon_factory, tmp_path, SLOW)
    timeouts = wait_for(lambda: with_outcome(d, "timeout", 2), 90, "two timed-out calls")
    events = decisions(d)
    first, second = timeouts[0]["id"], timeouts[1]["id"]
    between = [e["data"] for e in events if first < e["id"] < second]
    # While a call was out, the loop went on deciding every interval on the rules...
    pending = [e for e in between if e["outcome"] == "pending"]
    assert len(pending) >= 3, between
    assert all(e["running_s"] > 0 and e["reason"].startswith("no LLM decision (pending")
               for e in pending)
    assert [e["running_s"] for e in pending] == sorted(e["running_s"] for e in pending)
    gaps = [b["ts"] - a["ts"] for a, b in itertools.pairwise(events)]
    assert max(gaps) < 4 * INTERVAL_S, gaps
    # ... and a call past its timeout was aborted, the next decision saying so.
    data, asked = timeouts[0]["data"], timeouts[0]["request_id"]
    assert data["detail"] == "no answer within 2.50s" and data["latency_s"] >= 2.5
    assert data["reason"].startswith("no LLM decision (timeout: no answer within 2.50s)")
    aborted = [e for e in d.get(f"/v1/sessions/{INTERNAL_SESSION}/trace").json()["data"]
               if e["kind"] == "request.aborted" and e["request_id"] == asked]
    assert aborted and aborted[0]["data"]["error"] == "meta-llm call timed out"


def test_without_a_worker_the_rules_decide_and_the_trace_says_why(
        daemon_factory: Callable[..., DaemonProcess], tmp_path: Path) -> None:
    d = configured(daemon_factory, tmp_path, FAST, workers=0)
    found = wait_for(lambda: with_outcome(d, "no_worker", 2), 30, "no-worker decisions")
    data = found[0]["data"]
    assert data["detail"] == "no healthy worker serves any model"
    assert data["reason"].startswith("no LLM decision (no_worker: no healthy worker")
    assert d.get(f"/v1/sessions/{INTERNAL_SESSION}").status_code == 404  # nothing was sent
