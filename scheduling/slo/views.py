"""QoS feedback views (H-MAS Sec. 3.3): a short view for the Statera agent and the guards,
a long view for the meta controller, both computed from windows of timestamped events.

Feed ``ViewBuilder`` three kinds of events, each carrying its own time:
``on_arrival`` when a request arrives, ``on_completion`` when it finishes, and
``on_sample`` once per worker per scheduling cycle with the queue length and KV utilisation.

The windows are kept in time order (a late event is inserted in its place), so the short
view walks back from the newest completion only as far as its window reaches, and the
long view, which must walk its whole window, can be built in steps (`long_view_steps`)
by a caller that has other work to interleave (the daemon's event loop).
"""

from __future__ import annotations

import heapq
import math
import statistics
from bisect import bisect_right
from collections import deque
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import islice
from typing import TypeVar

from scheduling.slo import metrics as m
from scheduling.slo.metrics import CompletionRecord

T = TypeVar("T")
# Completions one step of `long_view_steps` walks: a step is what a caller that
# interleaves the build with other work (the daemon's event loop) holds at a time.
LONG_VIEW_STEP = 500


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
        _insert_sorted(self._arrivals, now, float)
        # Two long windows are kept so the view can compare against the previous one.
        while self._arrivals and self._arrivals[0] < self._arrivals[-1] - 2 * self.long_window_s:
            self._arrivals.popleft()

    def on_completion(self, record: CompletionRecord) -> None:
        _insert_sorted(self._done, record, _finish)
        while self._done and self._done[0].finish_s < self._done[-1].finish_s - self.long_window_s:
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
        done = [r for r in self._newest_since(cutoff) if worker in (None, r.worker)]
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

    def _newest_since(self, cutoff: float) -> list[CompletionRecord]:
        """Completions finished at `cutoff` or later. The window is kept in finish order,
        so the walk stops at the first older one: the short window, not the long one."""
        out: list[CompletionRecord] = []
        for r in reversed(self._done):
            if r.finish_s < cutoff:
                break
            out.append(r)
        return out

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
        return run_steps(self.long_view_steps(now))

    def long_view_steps(self, now: float, step: int = LONG_VIEW_STEP
                        ) -> Generator[None, None, LongView]:
        """`long_view(now)` in steps of `step` completions: yields between steps, returns
        the view. The builder must not change until it returns (step a `frozen()` copy)."""
        w = self.long_window_s
        acc = _LongSums(now - w, now - w / 2)
        for k, r in enumerate(self._done, 1):
            acc.add(r)
            if k % step == 0:
                yield
        yield  # the view itself is a step: a caller may have more to do after it
        return acc.view(w, self._arrivals_between(now - w, now),
                        self._arrivals_between(now - 2 * w, now - w))

    def _arrivals_between(self, start: float, end: float) -> int:
        return bisect_right(self._arrivals, end) - bisect_right(self._arrivals, start)


@dataclass
class _Tally:
    n: int = 0
    ok: int = 0

    def add(self, ok: bool) -> None:
        self.n += 1
        self.ok += ok

    @property
    def attainment(self) -> float:
        # An empty window met every SLO it was given (slo_metrics._fraction).
        return self.ok / self.n if self.n else 1.0


@dataclass
class _LongSums:
    """What V_long needs of the completions since `start`, summed one record at a time
    (scheduling/slo/metrics.py computes the same on a list)."""

    start: float
    split: float  # the older half of the window ends here (violation trend)
    all: _Tally = field(default_factory=_Tally)
    older: _Tally = field(default_factory=_Tally)
    recent: _Tally = field(default_factory=_Tally)
    ttft_ok: int = 0
    tpot_ok: int = 0
    prompt: int = 0
    output: int = 0
    output_sq: int = 0
    value: float = 0.0
    best: float = 0.0
    ttfts: list[list[float]] = field(default_factory=lambda: [[]])
    tenants: dict[str, _Tally] = field(default_factory=dict)

    def add(self, r: CompletionRecord) -> None:
        if r.finish_s < self.start:
            return
        ok = r.ok
        self.all.add(ok)
        (self.older if r.finish_s < self.split else self.recent).add(ok)
        self.tenants.setdefault(r.tenant, _Tally()).add(ok)
        self.ttft_ok += r.ttft_ok
        self.tpot_ok += r.tpot_ok
        self.prompt += r.prompt_tokens
        self.output += r.output_tokens
        self.output_sq += r.output_tokens * r.output_tokens
        base = m.base_value(r)
        self.value += base * m.service_gain(r)
        self.best += base
        if len(self.ttfts[-1]) >= LONG_VIEW_STEP:
            self.ttfts[-1].sort()  # sorted runs merge cheaply for the percentile
            self.ttfts.append([])
        self.ttfts[-1].append(r.ttft_s)

    def view(self, w: float, arrivals: int, prev_arrivals: int) -> LongView:
        n = self.all.n
        attainment = {t: s.attainment for t, s in sorted(self.tenants.items())}
        return LongView(
            window_s=w, arrival_rate=arrivals / w, prev_arrival_rate=prev_arrivals / w,
            completions=n,
            prompt_len_mean=self.prompt / n if n else 0.0,
            output_len_mean=self.output / n if n else 0.0,
            output_len_cv=self._output_cv(),
            violation_rate=1.0 - self.all.attainment,
            ttft_violation_rate=1.0 - (self.ttft_ok / n if n else 1.0),
            tpot_violation_rate=1.0 - (self.tpot_ok / n if n else 1.0),
            violation_trend=self.older.attainment - self.recent.attainment,
            ttft_p99_s=self._ttft_p99(),
            goodput=self.all.ok / w,
            esg_ratio=self.value / self.best if self.best > 0 else 1.0,
            tenant_attainment=attainment,
            fairness=jain_index(list(attainment.values())),
        )

    def _output_cv(self) -> float:
        n = self.all.n
        if n < 2 or self.output <= 0:
            return 0.0
        # Integers all the way: the population variance n*sum(x^2) - sum(x)^2 over n^2.
        spread = math.sqrt(n * self.output_sq - self.output * self.output) / n
        return spread / (self.output / n)

    def _ttft_p99(self) -> float:
        """`percentile(ttfts, 99)`: the value that many places from the top."""
        n = self.all.n
        if n == 0:
            return 0.0
        from_top = n - max(1, math.ceil(0.99 * n)) + 1
        self.ttfts[-1].sort()  # the others were sorted as they filled
        top = islice(heapq.merge(*(reversed(run) for run in self.ttfts), reverse=True), from_top)
        return list(top)[-1]


def run_steps(steps: Generator[None, None, T]) -> T:
    """Drive a stepped computation to its end at once."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]


def _finish(record: CompletionRecord) -> float:
    return record.finish_s


def _insert_sorted(window: deque[T], item: T, key: Callable[[T], float]) -> None:
    """Append, keeping `window` in key order: events from different sources can land
    slightly out of order, and the windows' walks stop at the first one too old."""
    at = len(window)
    while at > 0 and key(window[at - 1]) > key(item):
        at -= 1
    window.insert(at, item)
