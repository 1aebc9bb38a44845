"""QoS feedback views (H-MAS Sec. 3.3): a short view for the Statera agent and the guards,
a long view for the meta controller, both computed from windows of timestamped events.

Feed ``ViewBuilder`` three kinds of events, each carrying its own time:
``on_arrival`` when a request arrives, ``on_completion`` when it finishes, and
``on_sample`` once per worker per scheduling cycle with the queue length and KV utilisation.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from scheduling import slo_metrics as m
from scheduling.slo_metrics import CompletionRecord


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile, q in [0, 100]; 0.0 for no data."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100.0 * len(ordered)))
    return ordered[rank - 1]


def jain_index(values: Sequence[float]) -> float:
    """Jain's fairness index: 1 when all equal, 1/n when one tenant gets everything."""
    total_sq = sum(v * v for v in values)
    return (sum(values) ** 2) / (len(values) * total_sq) if total_sq > 0 else 1.0


@dataclass(frozen=True, slots=True)
class ShortView:
    """V_short for one worker, or for all of them when ``worker`` is None."""

    worker: str | None
    queue_len: int
    kv_util: float
    ttft_p50_s: float
    ttft_p99_s: float
    tpot_mean_s: float
    tpot_p99_s: float
    violation_rate: float
    completions: int


@dataclass(frozen=True, slots=True)
class LongView:
    """V_long: workload mix and smoothed QoS over the long window."""

    window_s: float
    arrival_rate: float
    prev_arrival_rate: float
    completions: int
    prompt_len_mean: float
    output_len_mean: float
    output_len_cv: float
    violation_rate: float
    ttft_violation_rate: float
    tpot_violation_rate: float
    violation_trend: float
    ttft_p99_s: float
    goodput: float
    esg_ratio: float
    tenant_attainment: Mapping[str, float]
    fairness: float


@dataclass(frozen=True, slots=True)
class _Sample:
    at: float
    queue_len: int
    kv_util: float


class ViewBuilder:
    """Windowed accumulators behind V_short and V_long; views are built on demand."""

    def __init__(self, short_window_s: float = 5.0, long_window_s: float = 60.0) -> None:
        self.short_window_s = short_window_s
        self.long_window_s = long_window_s
        self._arrivals: deque[float] = deque()
        self._done: deque[CompletionRecord] = deque()
        self._samples: dict[str, deque[_Sample]] = {}

    def on_arrival(self, now: float) -> None:
        self._arrivals.append(now)
        # Two long windows are kept so the view can compare against the previous one.
        while self._arrivals and self._arrivals[0] < now - 2 * self.long_window_s:
            self._arrivals.popleft()

    def on_completion(self, record: CompletionRecord) -> None:
        self._done.append(record)
        while self._done and self._done[0].finish_s < record.finish_s - self.long_window_s:
            self._done.popleft()

    def on_sample(self, now: float, worker: str, queue_len: int, kv_util: float) -> None:
        window = self._samples.setdefault(worker, deque())
        window.append(_Sample(now, queue_len, kv_util))
        while window and window[0].at < now - self.short_window_s:
            window.popleft()

    def frozen(self) -> ViewBuilder:
        """A copy that later events leave alone, so its views can be built elsewhere (a
        worker thread) while this builder keeps taking events. Records are immutable, so
        only the windows are copied."""
        copy = ViewBuilder(self.short_window_s, self.long_window_s)
        copy._arrivals = self._arrivals.copy()
        copy._done = self._done.copy()
        copy._samples = {worker: window.copy() for worker, window in self._samples.items()}
        return copy

    def forget_worker(self, worker: str) -> None:
        self._samples.pop(worker, None)

    def short_view(self, now: float, worker: str | None = None) -> ShortView:
        cutoff = now - self.short_window_s
        done = [r for r in self._done if r.finish_s >= cutoff and worker in (None, r.worker)]
        latest = self._latest_per_worker(cutoff, worker)
        ttfts = [r.ttft_s for r in done]
        tpots = [r.tpot_s for r in done]
        return ShortView(
            worker=worker,
            queue_len=sum(s.queue_len for s in latest),
            kv_util=self.kv_util(now, worker),
            ttft_p50_s=percentile(ttfts, 50),
            ttft_p99_s=percentile(ttfts, 99),
            tpot_mean_s=statistics.fmean(tpots) if tpots else 0.0,
            tpot_p99_s=percentile(tpots, 99),
            violation_rate=1.0 - m.slo_attainment(done),
            completions=len(done),
        )

    def kv_util(self, now: float, worker: str | None = None) -> float:
        """Mean KV utilisation over the short window: the short view's `kv_util` without
        walking the completions, for the per-worker controls of every cycle."""
        samples = self._recent_samples(now - self.short_window_s, worker)
        return statistics.fmean(s.kv_util for s in samples) if samples else 0.0

    def _recent_samples(self, cutoff: float, worker: str | None) -> list[_Sample]:
        return [
            s
            for name, window in self._samples.items()
            if worker in (None, name)
            for s in window
            if s.at >= cutoff
        ]

    def _latest_per_worker(self, cutoff: float, worker: str | None) -> list[_Sample]:
        out: list[_Sample] = []
        for name, window in self._samples.items():
            if worker in (None, name) and window and window[-1].at >= cutoff:
                out.append(window[-1])
        return out

    def long_view(self, now: float) -> LongView:
        w = self.long_window_s
        done = [r for r in self._done if r.finish_s >= now - w]
        half = [r for r in done if r.finish_s >= now - w / 2]
        older = [r for r in done if r.finish_s < now - w / 2]
        outputs = [float(r.output_tokens) for r in done]
        attainment = _tenant_attainment(done)
        return LongView(
            window_s=w,
            arrival_rate=self._arrivals_between(now - w, now) / w,
            prev_arrival_rate=self._arrivals_between(now - 2 * w, now - w) / w,
            completions=len(done),
            prompt_len_mean=statistics.fmean(r.prompt_tokens for r in done) if done else 0.0,
            output_len_mean=statistics.fmean(outputs) if outputs else 0.0,
            output_len_cv=_cv(outputs),
            violation_rate=1.0 - m.slo_attainment(done),
            ttft_violation_rate=1.0 - m.ttft_compliance(done),
            tpot_violation_rate=1.0 - m.tpot_compliance(done),
            violation_trend=m.slo_attainment(older) - m.slo_attainment(half),
            ttft_p99_s=percentile([r.ttft_s for r in done], 99),
            goodput=m.goodput(done, w),
            esg_ratio=m.esg_ratio(done),
            tenant_attainment=attainment,
            fairness=jain_index(list(attainment.values())),
        )

    def _arrivals_between(self, start: float, end: float) -> int:
        return sum(1 for t in self._arrivals if start < t <= end)


def _cv(values: Sequence[float]) -> float:
    if len(values) < 2:
        return 0.0
    mean = statistics.fmean(values)
    return statistics.pstdev(values) / mean if mean > 0 else 0.0


def _tenant_attainment(done: Sequence[CompletionRecord]) -> dict[str, float]:
    by_tenant: dict[str, list[CompletionRecord]] = {}
    for record in done:
        by_tenant.setdefault(record.tenant, []).append(record)
    return {tenant: m.slo_attainment(rs) for tenant, rs in sorted(by_tenant.items())}
