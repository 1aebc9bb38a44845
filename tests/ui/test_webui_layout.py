"""The web UI's pure parts: timeline, futures graph, side-by-side diff, charts."""

from __future__ import annotations

import difflib

import pytest

from console.client import metric_samples
from console.trace_spans import build_spans
from webui.diffview import side_by_side
from webui.futuregraph import NODE_W, futures_of
from webui.futuregraph import layout as graph
from webui.timeline import layout


def _ev(i: int, ts: float, kind: str, **kw: object) -> dict[str, object]:
    return {"id": i, "ts": ts, "kind": kind, "program_id": kw.pop("program_id", "p"),
            "request_id": kw.pop("request_id", None), "worker_id": kw.pop("worker_id", None),
            "data": kw}


def test_timeline_layout_spans_and_markers() -> None:
    events = [
        _ev(1, 100.0, "program.created"),
        _ev(2, 100.0, "request.queued", request_id="r1"),
        _ev(3, 100.5, "request.dispatched", request_id="r1", worker_id="w0"),
        _ev(4, 100.6, "kv.admit", worker_id="w0", reason="room", policy="agentd",
            policy_version=3),
        _ev(5, 100.75, "request.first_token", request_id="r1", worker_id="w0"),
        _ev(6, 101.0, "request.finished", request_id="r1", prompt_tokens=5, cached_tokens=0,
            output_tokens=9, reason="length"),
        _ev(7, 101.0, "program.status", old="ACTING", new="PAUSED", reason="thrashing"),
        _ev(8, 102.0, "program.status", old="PAUSED", new="QUEUED", reason="restored"),
        _ev(9, 102.0, "program.migrated", source="w0", target="w1", by="op"),
        _ev(10, 102.5, "tool.exec.start", tool="shell", exec_id=1),
        _ev(11, 103.0, "tool.exec.end", tool="shell", exec_id=1, ok=True, exit_code=0),
        _ev(12, 104.0, "program.status", old="ACTING", new="STOPPED", reason="released"),
        _ev(13, 100.2, "request.queued", program_id="q", request_id="r2"),
    ]
    t = layout(events)
    assert [lane.program_id for lane in t.lanes] == ["p", "q"]
    p = t.lanes[0]
    kinds = {s.kind: s for s in p.spans}
    assert set(kinds) == {"queue", "prefill", "decode", "pause", "tool"}
    assert kinds["queue"].w == pytest.approx(kinds["pause"].w / 2, rel=0.01)
    assert kinds["prefill"].x == pytest.approx(kinds["queue"].x + kinds["queue"].w)
    assert kinds["decode"].x == pytest.approx(kinds["prefill"].x + kinds["prefill"].w)
    assert kinds["prefill"].w == pytest.approx(kinds["decode"].w * 1.0, rel=0.01)
    # TTFT from the request's queueing, as the daemon and the TUI count it
    assert "TTFT 750 ms" in kinds["decode"].title and "output 9" in kinds["decode"].title
    assert "on w0" in kinds["decode"].title and "finished (length)" in kinds["decode"].title
    assert "thrashing" in kinds["pause"].title
    assert kinds["tool"].w == pytest.approx(kinds["queue"].w, rel=0.01)
    assert kinds["tool"].title == "tool shell: 500 ms, exit 0 (ok)"
    assert [m.kind for m in p.markers] == ["decision", "migrate", "end"]
    assert p.markers[0].title == "kv.admit on w0 by policy agentd v3: room"
    assert "w0 -> w1" in p.markers[1].title
    # r2 never got dispatched: its queue span runs to the end of the trace.
    q = t.lanes[1].spans[0]
    assert q.kind == "queue" and q.x + q.w == pytest.approx(t.width - 10)
    assert layout([]).lanes == []


def test_timeline_draws_what_the_tui_reads() -> None:
    """The shapes come from console/trace_spans.py, so a requeued request shows each
    of its waits (as the TUI's rows do), a finished request carries the daemon's SLO
    verdict, and a run's control decision and call migration are markers."""
    events = [
        _ev(1, 10.0, "request.queued", request_id="r", task="chat", slo_ttft_s=0.5,
            slo_tpot_s=0.05),
        _ev(2, 10.2, "request.dispatched", request_id="r", worker_id="w0"),
        _ev(3, 10.4, "request.requeued", request_id="r", reason="paused"),
        _ev(4, 11.0, "request.dispatched", request_id="r", worker_id="w1"),
        _ev(5, 11.2, "request.first_token", request_id="r", worker_id="w1"),
        _ev(6, 11.3, "request.finished", request_id="r", prompt_tokens=4, cached_tokens=0,
            output_tokens=2, reason="stop"),
        _ev(7, 11.5, "control.decision", by="operator", ok=False, reason="no such instance",
            decision_kind="Migrate"),
        _ev(8, 11.6, "future.migrated", run_id="run", id="f1", source="A#0",
            destination="A#1"),
    ]
    [lane] = layout(events).lanes
    [request] = [s for s in build_spans(events) if s.kind == "request"]
    assert [s.kind for s in lane.spans] == [seg.kind for seg in request.segments] == [
        "queue", "prefill", "queue", "prefill", "decode"]
    decode = lane.spans[-1]
    assert "r on w1: decode 100 ms, TTFT 1.20 s" in decode.title
    assert "SLO missed on ttft (task chat: TTFT \u2264 500 ms, TPOT \u2264 50 ms)" in decode.title
    decision, moved = lane.markers
    assert decision.title == "control decision Migrate by operator: refused: no such instance"
    assert moved.kind == "migrate" and moved.title == "call f1 moved A#0 -> A#1"


def test_timeline_zoom_widens_the_plot_and_its_ticks() -> None:
    events = [_ev(1, 10.0, "request.queued", request_id="r"),
              _ev(2, 12.0, "request.dispatched", request_id="r")]
    one, four = layout(events), layout(events, zoom=4)
    assert four.width - four.label_w - 10 == 4 * (one.width - one.label_w - 10)
    assert len(four.ticks) == 17 and len(one.ticks) == 5
    assert layout(events, zoom=3).width == one.width  # only the offered zooms


def _future(i: int, event: str, fid: str, run: str = "run-1",
            **data: object) -> dict[str, object]:
    return {"id": i, "ts": float(i), "kind": event, "program_id": "prog", "data": {
        "run_id": run, "id": fid, **data}}


def test_futures_graph_columns_follow_dependencies() -> None:
    events = [
        _future(1, "future.created", "fut-1", name="market_data", kind="tool", dependencies=[]),
        _future(2, "future.created", "fut-2", name="Stock.analyse", kind="agent",
                dependencies=["fut-1"]),
        _future(3, "future.created", "fut-3", name="News.analyse", kind="agent",
                dependencies=[]),
        _future(4, "future.created", "fut-4", name="Summary", kind="agent",
                dependencies=["fut-2", "fut-3"]),
        _future(5, "future.resolved", "fut-1", status="done", executor="tool:market_data",
                started_at=1.0, finished_at=1.25, dependencies=[]),
        _future(6, "future.resolved", "fut-4", status="failed", error="ValueError: x",
                dependencies=["fut-2", "fut-3"]),
        # another run reuses the same future ids: a different node
        _future(7, "future.created", "fut-1", run="run-2", name="market_data", kind="tool"),
        {"id": 8, "ts": 8.0, "kind": "request.queued", "program_id": "prog", "data": {}},
    ]
    assert len(futures_of(events)) == 5
    g = graph(events)
    nodes = {n.key: n for n in g.nodes}
    col = {k: round(n.x / (NODE_W + 56)) for k, n in nodes.items()}
    assert col == {"run-1:fut-1": 0, "run-1:fut-2": 1, "run-1:fut-3": 0, "run-1:fut-4": 2,
                   "run-2:fut-1": 0}
    assert nodes["run-1:fut-1"].status == "done" and nodes["run-1:fut-2"].status == "pending"
    assert "ran 250 ms" in nodes["run-1:fut-1"].title
    assert "error: ValueError: x" in nodes["run-1:fut-4"].title
    assert "waits for fut-2, fut-3" in nodes["run-1:fut-4"].title
    assert sorted(e.title for e in g.edges) == [
        "Stock.analyse waits for market_data", "Summary waits for News.analyse",
        "Summary waits for Stock.analyse"]
    assert g.width >= 3 * NODE_W and g.left_out == 0
    assert graph([]).nodes == []


def test_side_by_side_pairs_changed_lines() -> None:
    old = "a\nb\nc\nd\ne\n"
    new = "a\nB\nc\nd\ne\nf\ng\n"
    diff = "".join(difflib.unified_diff(old.splitlines(True), new.splitlines(True),
                                        fromfile="x v1", tofile="x v2"))
    rows = side_by_side(diff)
    assert rows[0].kind == "hunk"
    body = [(r.kind, r.left_no, r.left, r.right_no, r.right) for r in rows[1:]]
    assert ("change", 2, "b", 2, "B") in body
    assert ("same", 3, "c", 3, "c") in body
    assert body[-2:] == [("add", None, "", 6, "f"), ("add", None, "", 7, "g")]
    assert side_by_side("") == []
    removed = side_by_side("--- a\n+++ b\n@@ -1,2 +1 @@\n-x\n--- y\n+z\n")
    assert [(r.kind, r.left, r.right) for r in removed[1:]] == [
        ("change", "x", "z"), ("del", "-- y", "")]


METRICS = """# HELP vllm:generation_tokens_total Generated tokens
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{model_name="m",worker="w0"} 60.0
vllm:generation_tokens_total{model_name="m",worker="w1"} 40.0
# TYPE vllm:e2e_request_latency_seconds histogram
vllm:e2e_request_latency_seconds_bucket{le="0.5"} 3.0
vllm:e2e_request_latency_seconds_bucket{le="+Inf"} 5.0
vllm:e2e_request_latency_seconds_count 5.0
vllm:e2e_request_latency_seconds_sum 2.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{worker="w\\"0",engine="sim"} 0.5
"""


def test_metrics_parse() -> None:
    """The consoles' one parser (prometheus_client's) reads what the daemon writes; the
    overview's charts come from the stored history (tests/ui/test_webui_history_charts.py)."""
    samples = metric_samples(METRICS)
    assert ("vllm:kv_cache_usage_perc", {"worker": 'w"0', "engine": "sim"}, 0.5) in samples
    assert sum(v for n, _, v in samples if n == "vllm:generation_tokens_total") == 100.0
