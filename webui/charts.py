"""Cluster throughput, goodput and KV usage over the last minutes, as small line charts.

The daemon exposes counters (/metrics, /v1/scheduling) and live gauges (/v1/workers), not
history. The UI samples them while someone watches the overview (one sample per interval,
shared by every viewer) and turns successive samples into rates. Goodput is the daemon's
own count of requests that met both SLOs of their task (/v1/scheduling `counters.met`):
the UI judges nothing itself. Pure: the caller feeds the samples.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from console.client import MetricSample, metric_samples

WINDOW_S = 300.0  # what a chart shows at most
MIN_WINDOW_S = 60.0  # ...and at least, so a young history is not squeezed to the right
KEEP_S = 900.0  # what the history holds
MIN_INTERVAL_S = 0.9  # viewers share samples: at most one per second
CHART_W, CHART_H = 300, 80

def metric(samples: list[MetricSample], name: str, **labels: str) -> float:
    """The sum of `name` over every sample whose labels include `labels`."""
    return sum(v for n, lab, v in samples
               if n == name and all(lab.get(k) == want for k, want in labels.items()))


@dataclass(frozen=True, slots=True)
class Sample:
    ts: float
    generated_tokens: float  # counters since the daemon started
    finished_requests: float
    good_requests: float  # finished within their task's TTFT and TPOT SLOs
    kv_used: float
    kv_capacity: float
    slo_window: dict[str, Any] = field(default_factory=dict)  # the daemon's long window


def sample_of(ts: float, metrics_text: str, workers: list[dict[str, Any]],
              scheduling: dict[str, Any]) -> Sample:
    """One sample from /metrics, the overview's worker rows and GET /v1/scheduling."""
    s = metric_samples(metrics_text)
    return Sample(
        ts=ts,
        generated_tokens=metric(s, "vllm:generation_tokens_total"),
        finished_requests=metric(s, "vllm:e2e_request_latency_seconds_count"),
        good_requests=float((scheduling.get("counters") or {}).get("met", 0)),
        kv_used=sum(float(w.get("kv_used") or 0) for w in workers),
        kv_capacity=sum(float(w.get("kv_capacity") or 0) for w in workers),
        slo_window=dict(scheduling.get("window") or {}),
    )


def window_note(window: dict[str, Any]) -> str:
    """The daemon's long-window goodput and attainment, for the goodput chart's caption."""
    if "seconds" not in window:
        return ""
    span = f"{window['seconds']:.0f} s"
    if not window.get("completions"):
        return f" (none finished in the last {span})"
    return (f" ({window.get('goodput_rps', 0.0):.3g} req/s, "
            f"{window.get('slo_attainment', 0.0):.0%} met their SLOs over the last {span})")


class History:
    """Samples of the last KEEP_S seconds, oldest first."""

    def __init__(self) -> None:
        self.samples: deque[Sample] = deque()

    def due(self, now: float) -> bool:
        return not self.samples or now - self.samples[-1].ts >= MIN_INTERVAL_S

    def add(self, sample: Sample) -> None:
        if not self.due(sample.ts):
            return
        self.samples.append(sample)
        while self.samples and sample.ts - self.samples[0].ts > KEEP_S:
            self.samples.popleft()

    def window(self, now: float) -> float:
        held = now - self.samples[0].ts if self.samples else 0.0
        return min(WINDOW_S, max(MIN_WINDOW_S, held))

    def charts(self, now: float) -> list[dict[str, Any]]:
        pairs = list(zip(list(self.samples), list(self.samples)[1:], strict=False))
        span = self.window(now)
        return [
            _chart("throughput", "Throughput", "tokens/s", now, span,
                   [(b.ts, _rate(a.generated_tokens, b.generated_tokens, a, b)) for a, b in pairs]),
            _chart("requests", "Finished requests", "req/s", now, span,
                   [(b.ts, _rate(a.finished_requests, b.finished_requests, a, b))
                    for a, b in pairs]),
            _chart("goodput", "Goodput (requests within their SLOs)", "req/s", now, span,
                   [(b.ts, _rate(a.good_requests, b.good_requests, a, b)) for a, b in pairs],
                   note=window_note(self.samples[-1].slo_window) if self.samples else ""),
            _chart("kv", "KV cache used", "%", now, span,
                   [(s.ts, 100.0 * s.kv_used / s.kv_capacity if s.kv_capacity else 0.0)
                    for s in self.samples], y_max=100.0),
        ]


def _rate(before: float, after: float, a: Sample, b: Sample) -> float:
    # A counter that went down means the daemon restarted: no rate for that step.
    return max(after - before, 0.0) / max(b.ts - a.ts, 1e-6)


def _chart(key: str, title: str, unit: str, now: float, span: float,
           points: list[tuple[float, float]], y_max: float | None = None,
           note: str = "") -> dict[str, Any]:
    shown = [(t, v) for t, v in points if now - t <= span]
    top = y_max if y_max is not None else max([v for _, v in shown] + [1.0]) * 1.1
    coords = [(CHART_W * (1 - (now - t) / span), CHART_H * (1 - v / top)) for t, v in shown]
    since = f"\u2212{span / 60:.0f} min" if span >= 120 else f"\u2212{span:.0f} s"
    return {
        "key": key, "title": title, "unit": unit, "since": since,
        "points": " ".join(f"{x:.1f},{y:.1f}" for x, y in coords),
        "top": f"{top:.3g} {unit}",
        "last": (f"{shown[-1][1]:.3g} {unit}" if shown else "no data yet") + note,
        "n": len(shown),
    }
