"""The TUI's pure parts: trace rows, rates, alerts, sorting, metric parsing."""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from console.client import metric_sums
from console.render import nbytes
from console.trace_spans import Span, build_spans, slo_outcome
from console.tui import add_tui_parser
from console.tui.alerts import alerts, imbalance_alert, rollback_alerts
from console.tui.data import Snapshot
from console.tui.rates import Rates
from console.tui.screens.overview import rate_titles
from console.tui.timeline import bar_cells, describe, slo_text
from console.tui.widgets.programs_table import SORTS, sort_programs

T0 = 1000.0


def ev(kind: str, ts: float, pid: str = "p1", rid: str | None = None,
       worker: str | None = None, **data: Any) -> dict[str, Any]:
    return {"kind": kind, "ts": T0 + ts, "program_id": pid, "request_id": rid,
            "worker_id": worker, "data": data}


SESSION = [
    ev("program.created", 0.0),
    ev("request.queued", 0.0, rid="r1", max_tokens=8),
    ev("kv.admit", 0.01, worker="w0", reason="routed", policy="agentd"),
    ev("program.status", 0.01, old="QUEUED", new="REASONING", reason="request dispatched"),
    ev("request.dispatched", 0.01, rid="r1", worker="w0"),
    ev("request.first_token", 0.05, rid="r1", worker="w0"),
    ev("request.finished", 0.25, rid="r1", worker="w0", prompt_tokens=40, cached_tokens=32,
       output_tokens=8, reason="length"),
    ev("program.status", 0.25, old="REASONING", new="ACTING", reason="request ended"),
    ev("tool.exec.start", 0.3, tool="shell", exec_id=1),
    ev("tool.prepare.start", 0.3, tool="shell", backend="process"),
    ev("tool.prepare.end", 0.4, tool="shell", ok=True, duration_s=0.1),
    ev("tool.exec.end", 0.9, tool="shell", exec_id=1, ok=True, exit_code=0,
       stderr_tail="x" * 400),
    ev("program.migrated", 1.0, worker="w1", source="w0", target="w1", by="op",
       recompute_tokens=48),
    ev("request.queued", 1.1, rid="r2"),
    ev("program.status", 1.2, old="ACTING", new="PAUSED", reason="paused by an operator"),
    ev("request.dispatched", 2.0, rid="r2", worker="w1"),
    ev("request.requeued", 2.1, rid="r2", worker="w1", reason="paused"),
    ev("request.dispatched", 2.5, rid="r2", worker="w1"),
    ev("request.first_token", 4.0, rid="r2", worker="w1"),
    ev("request.finished", 4.5, rid="r2", worker="w1", prompt_tokens=60, cached_tokens=0,
       output_tokens=4),
    ev("program.status", 5.0, old="ACTING", new="STOPPED", reason="released"),
    ev("request.queued", 0.5, pid="p2", rid="r3"),
]


def test_rows_group_by_program_with_phases() -> None:
    spans = build_spans(SESSION)
    assert [s.kind for s in spans] == ["program", "request", "decision", "tool", "tool",
                                       "migrate", "request", "request"]
    assert [s.program_id for s in spans][-1] == "p2"  # p2's row comes after p1's group
    program, r1, r2 = spans[0], spans[1], spans[6]
    assert [g.kind for g in program.segments] == ["queued", "reasoning", "acting", "paused"]
    assert program.end == T0 + 5.0 and program.details["status"] == "STOPPED"
    assert [g.kind for g in r1.segments] == ["queue", "prefill", "decode"]
    assert r1.phase("prefill", 0) == pytest.approx(0.04)
    assert [g.kind for g in r2.segments] == ["queue", "prefill", "queue", "prefill", "decode"]
    assert r2.details["moves"] == 1 and r2.worker_id == "w1"
    assert spans[-1].end is None  # r3 is still queued


def test_drill_down_names_tokens_worker_and_slo() -> None:
    spans = build_spans(SESSION)
    text = describe(spans[1], T0 + 10, ttft_slo_s=0.1)
    assert "request r1 of program p1" in text and "worker w0" in text
    assert "tokens: prompt 40 (cached 32) output 8" in text
    assert "ttft 50ms" in text and "SLO met" in text
    assert "SLO MISSED" in describe(spans[6], T0 + 10, ttft_slo_s=0.1)  # ttft 2.9 s
    assert "SLO pending" in describe(spans[-1], T0 + 10, ttft_slo_s=0.1)
    tool = describe(spans[3], T0 + 10)
    assert "shell exec" in tool and "exit_code=0" in tool and "stderr" not in tool
    assert "recompute_tokens=48" in describe(spans[5], T0 + 10)
    assert "paused 3.8s" in describe(spans[0], T0 + 10)
    unserved = Span("request", "p1", T0, T0 + 1, request_id="r9",
                    details={"queued_at": T0})
    outcome = slo_outcome(unserved, 1.0)
    assert outcome is not None and slo_text(outcome) == "SLO missed (no first token)"
    assert slo_outcome(unserved) is None  # no SLO tagged and no fallback: no verdict


def tagged(rid: str, first: float, end: float | None, out: int) -> list[dict[str, Any]]:
    """One request the daemon tagged with its task's SLO: TTFT 0.5 s, TPOT 50 ms."""
    events = [ev("request.queued", 0.0, rid=rid, task="chat", slo_ttft_s=0.5,
                 slo_tpot_s=0.05, l_pred=20),
              ev("request.dispatched", 0.1, rid=rid, worker="w0"),
              ev("request.first_token", first, rid=rid, worker="w0")]
    if end is not None:
        events.append(ev("request.finished", end, rid=rid, worker="w0", prompt_tokens=10,
                         cached_tokens=0, output_tokens=out, reason="stop"))
    return events


def test_verdict_uses_the_slo_the_daemon_tagged_the_request_with() -> None:
    """The fallback TTFT SLO (1 s here) is not what judges a tagged request: its task's
    TTFT and TPOT are, as the daemon's goodput counts it."""
    def verdict(first: float, end: float | None, out: int) -> str:
        [span] = build_spans(tagged("r", first, end, out))
        return describe(span, T0 + 10, ttft_slo_s=1.0)

    met = verdict(0.3, 0.3 + 0.04 * 10, 11)  # ttft 300 ms, tpot 40 ms
    assert "SLO met (ttft ≤ 500ms, tpot ≤ 50ms, task chat)" in met and "tpot 40ms" in met
    assert "SLO MISSED on ttft" in verdict(0.8, 1.0, 3)  # met the 1 s fallback, not 0.5 s
    assert "SLO MISSED on tpot" in verdict(0.3, 0.3 + 0.06 * 10, 11)
    assert "SLO pending (ttft ≤ 500ms" in verdict(0.3, None, 0)  # tpot unknown until done
    assert "slo_ttft_s" not in met and "task=" not in met  # said once, in the verdict


def test_run_control_events_are_rows() -> None:
    """An operator's control decision and the call migrations it causes show in the trace."""
    events = [ev("program.created", 0.0, pid="drv"),
              ev("control.decision", 1.0, pid="drv", by="operator", ok=True, reason=None,
                 decision_kind="Migrate", decision_session_id="s", source="W#0",
                 destination="W#1"),
              ev("future.migrated", 1.2, pid="drv", run_id="run-1", id="f3", source="W#0",
                 destination="W#1")]
    _, decision, moved = build_spans(events)
    assert (decision.kind, decision.name) == ("decision", "control Migrate")
    assert "by=operator" in describe(decision, T0 + 2)
    assert moved.kind == "migrate" and moved.name == "call → W#1"
    assert moved.details == {"from": "W#0", "to": "W#1", "call": "f3"}


def test_bars_scale_to_the_width() -> None:
    spans = build_spans(SESSION)
    program = spans[0]
    assert bar_cells(program, T0, T0 + 5.0, 51, T0 + 5.0) == (0, 50)
    assert bar_cells(spans[6], T0, T0 + 5.0, 51, T0 + 5.0) == (11, 45)


def snap(t: float, generated: float, met: float, **kw: Any) -> Snapshot:
    window = kw.get("window", {"seconds": 60.0, "completions": 0})
    return Snapshot({"status": "ok"}, kw.get("workers", []), [], 0, t,
                    {"vllm:generation_tokens_total": generated},
                    {"counters": {"completed": met + 1, "met": met}, "window": window},
                    policy_events=kw.get("events", []))


def test_goodput_is_the_daemons_count_of_requests_that_met_their_slo() -> None:
    rates = Rates()
    for s in (snap(0, 0, 0), snap(2, 100, 4), snap(2, 100, 4), snap(3, 160, 5),
              snap(4, 10, 0), snap(5, 30, 1)):
        rates.add(s)
    assert list(rates.throughput) == [50.0, 60.0, 20.0]  # the restart (160 → 10) adds nothing
    assert list(rates.goodput) == [2.0, 1.0, 1.0]
    assert rate_titles(rates)[1].endswith("(none finished in 60s)")
    rates.add(snap(6, 40, 3, window={"seconds": 60.0, "completions": 40,
                                     "goodput_rps": 0.5, "slo_attainment": 0.75}))
    assert rate_titles(rates)[1] == "goodput 2.00 req/s met their SLOs (60s: 0.50/s, 75% met)"


def worker(wid: str, used: int, status: str = "healthy") -> dict[str, Any]:
    return {"id": wid, "status": status, "kv_capacity_tokens": 1000,
            "stats": {"kv_capacity_tokens": 1000, "kv_used_tokens": used}}


def test_alerts() -> None:
    assert imbalance_alert([worker("a", 900), worker("b", 100)], 0.3) is not None
    assert imbalance_alert([worker("a", 500), worker("b", 300)], 0.3) is None
    assert imbalance_alert([worker("a", 900), worker("b", 0, "unhealthy")], 0.3) is None
    rolled = {"kind": "policy.rolled_back", "ts": T0, "data": {
        "name": "boom", "version": 2, "restored": "agentd", "restored_version": 1,
        "reason": "RuntimeError", "automatic": True}}
    assert "boom v2 rolled back automatically" in rollback_alerts([rolled], T0 + 5)[0].text
    assert rollback_alerts([rolled], T0 + 3600) == []  # old news
    found = alerts(snap(0, 0, 0, workers=[worker("a", 0, "unhealthy")], events=[rolled]), T0)
    assert [a.severity for a in found] == ["error", "error", "warning"]


def test_sorts_put_missing_values_last() -> None:
    programs = [{"id": "a", "context_tokens": 5, "worker_id": None},
                {"id": "b", "context_tokens": 9, "worker_id": "w1"},
                {"id": "c", "context_tokens": 1, "worker_id": "w0"}]
    tokens = [name for name, _, _ in SORTS].index("tokens")
    assert [p["id"] for p in sort_programs(programs, tokens, False)] == ["b", "a", "c"]
    assert [p["id"] for p in sort_programs(programs, tokens, True)] == ["c", "a", "b"]
    by_worker = [name for name, _, _ in SORTS].index("worker")
    assert [p["id"] for p in sort_programs(programs, by_worker, False)] == ["c", "b", "a"]


def test_metric_parsing_and_sizes() -> None:
    text = ('# TYPE t_total counter\nt_total{worker="a"} 3\nt_total{worker="b"} 4\n'
            '# TYPE t_created gauge\nt_created{worker="a"} 1.7e9\n'
            '# TYPE g gauge\ng 2.5\n# TYPE h histogram\nh_bucket{le="1.0"} 2\n'
            'h_bucket{le="+Inf"} 3\nh_count 3\nh_sum 4.5\n')
    # a counter over every worker; a histogram's count and sum, not its buckets
    assert metric_sums(text) == {"t_total": 7.0, "g": 2.5, "h_count": 3.0, "h_sum": 4.5}
    assert [nbytes(v) for v in (None, 512, 1536, 5 * 2**30)] == [
        "-", "512 B", "1.5 KiB", "5.0 GiB"]


def test_tui_flags() -> None:
    parser = argparse.ArgumentParser(prog="agentctl")
    add_tui_parser(parser.add_subparsers(dest="command", required=True))
    a = parser.parse_args(["tui", "--read-only", "--ttft-slo", "0.5", "--kv-imbalance", "0.2"])
    assert (a.read_only, a.ttft_slo, a.kv_imbalance) == (True, 0.5, 0.2)
    for bad in (["tui", "--kv-imbalance", "1.5"], ["tui", "--ttft-slo", "0"],
                ["top", "--interval", "0.01"]):
        with pytest.raises(SystemExit) as exit_info:
            parser.parse_args(bad)
        assert exit_info.value.code == 2
