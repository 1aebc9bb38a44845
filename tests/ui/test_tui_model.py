"""The TUI's pure parts: trace rows, rates, alerts, sorting, metric parsing."""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from console.client import histogram_buckets
from console.render import nbytes
from console.tui import add_tui_parser
from console.tui.alerts import alerts, imbalance_alert, rollback_alerts
from console.tui.data import Snapshot
from console.tui.rates import Rates, slo_bucket
from console.tui.timeline import bar_cells, build_spans, describe, slo_verdict
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
    assert slo_verdict(None, 1.0, ended=True) == "SLO missed (no first token)"


def test_bars_scale_to_the_width() -> None:
    spans = build_spans(SESSION)
    program = spans[0]
    assert bar_cells(program, T0, T0 + 5.0, 51, T0 + 5.0) == (0, 50)
    assert bar_cells(spans[6], T0, T0 + 5.0, 51, T0 + 5.0) == (11, 45)


def snap(t: float, generated: float, good: float, **kw: Any) -> Snapshot:
    return Snapshot({"status": "ok"}, kw.get("workers", []), [], 0, t,
                    {"vllm:generation_tokens": generated},
                    {0.5: good, 1.0: good + 1, float("inf"): good + 2},
                    policy_events=kw.get("events", []))


def test_rates_from_counter_deltas() -> None:
    rates = Rates(ttft_slo_s=0.8)
    for s in (snap(0, 0, 0), snap(2, 100, 4), snap(2, 100, 4), snap(3, 160, 5),
              snap(4, 10, 0), snap(5, 30, 1)):
        rates.add(s)
    assert rates.bucket == 0.5  # the SLO rounds down to a bucket bound
    assert list(rates.throughput) == [50.0, 60.0, 20.0]  # the restart (160 → 10) adds nothing
    assert list(rates.goodput) == [2.0, 1.0, 1.0]
    assert slo_bucket([0.5, 1.0], 0.1) is None


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
    text = ('# TYPE x histogram\nx_bucket{le="0.5"} 3\nx_bucket{le="+Inf"} 7\nx_count 7\n'
            'x_bucket{worker="a",le="0.5"} 99\n')
    assert histogram_buckets(text, "x") == {0.5: 3.0, float("inf"): 7.0}
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
