"""The overview's charts and alerts from the stored history (webui/history_charts.py),
pure: a /v1/history answer laid out as lines, the alert line from recent events."""

from __future__ import annotations

from typing import Any

from webui import history_charts as hc

NOW = 10_000.0


def _event(kind: str, age_s: float, count: int = 1, message: str = "m") -> dict[str, Any]:
    return {"id": 1, "ts": NOW - age_s, "last_ts": NOW - age_s, "kind": kind,
            "severity": "error", "count": count, "message": message}


def test_each_series_is_a_line_placed_by_time_and_value() -> None:
    body = {"series": [
        {"name": "requests_per_s", "label": "", "points": [[NOW - 3600, 0.0], [NOW, 2.0]]},
        {"name": "goodput_per_s", "label": "", "points": [[NOW - 1800, 1.0]]},
        {"name": "kv_used_pct", "label": "w0", "points": [[NOW - 60, 50.0]]},
        {"name": "kv_used_pct", "label": "w1", "points": [[NOW - 7200, 90.0]]},  # too old
    ]}
    charts = {c["key"]: c for c in hc.charts_of(body, NOW, 3600.0)}
    assert [c.key for c in hc.CHARTS] == list(charts)
    req = charts["requests"]
    assert [ln["name"] for ln in req["lines"]] == ["requests_per_s", "goodput_per_s"]
    assert req["lines"][0]["points"] == "0.0,80.0 300.0,7.3"  # top = 2.0 * 1.1
    assert req["lines"][1]["points"] == "148.0,43.6 150.0,43.6"  # a lone point: a dash
    kv = charts["kv"]
    assert [ln["name"] for ln in kv["lines"]] == ["kv_used_pct w0", "kv_used_pct w1"]
    assert kv["lines"][0]["points"] == "293.0,40.0 295.0,40.0" and kv["lines"][1]["n"] == 0
    assert charts["ttft"]["last"] == "no data in this range" and charts["ttft"]["n"] == 0
    assert req["since"] == "\u22121 h" and charts["kv"]["top"] == "100 %"


def test_alerts_name_recent_failures_and_crashes_only() -> None:
    events = [_event("request.failed", 60, count=3), _event("request.failed", 200, count=2),
              _event("http.5xx", 400, count=9),  # older than 5 minutes
              _event("worker.exited", 300, message="worker w0 process exited with -9"),
              _event("worker.crash", 900, message="worker w1 stopped answering")]
    alerts = hc.recent_alerts(events, NOW)
    assert alerts == ["5 request(s) failed in the last 5 minutes",
                      "worker w0 process exited with -9 (5 min ago)"]
    assert hc.recent_alerts([], NOW) == []


def test_the_range_falls_back_to_the_hour() -> None:
    assert hc.range_of("day") == "day" and hc.range_of("year") == "hour"
    assert hc.range_of("15m") == "15m" and hc.step_of(hc.RANGES["15m"]) == 3
    assert hc.step_of(hc.RANGES["hour"]) == 12 and hc.step_of(hc.RANGES["day"]) == 288
