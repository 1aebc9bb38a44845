"""What a replay measures, and the result row it reports."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from scheduling.slo import metrics as slo_metrics
from scheduling.slo.metrics import CompletionRecord


@dataclass(slots=True)
class RequestRecord:
    request_id: str
    program_id: str
    worker: str
    tenant: str
    task: str
    arrival: float  # when the request became ready (before any global-queue wait)
    prompt_tokens: int
    ideal_cached: int  # what an unlimited prefix cache would have hit
    slo_ttft_s: float
    slo_tpot_s: float
    l_pred: int = 0
    dispatch: float = 0.0
    first_token: float | None = None
    finish: float | None = None
    cached_tokens: int = 0
    output_tokens: int = 0
    preemptions: int = 0

    def completion(self) -> CompletionRecord:
        assert self.finish is not None and self.first_token is not None
        tpot = (self.finish - self.first_token) / max(1, self.output_tokens - 1)
        return CompletionRecord(
            self.request_id, self.tenant, self.worker, self.arrival, self.finish,
            self.prompt_tokens, self.output_tokens, self.first_token - self.arrival, tpot,
            self.slo_ttft_s, self.slo_tpot_s, self.task, self.l_pred,
        )


@dataclass
class Samples:
    """Per-tick samples: the spread of workers' KV use and how many programs are paused."""

    imbalance: list[float] = field(default_factory=list)
    paused: int = 0
    live: int = 0

    def add(self, fractions: Sequence[float], paused: int, live: int) -> None:
        if fractions:
            self.imbalance.append(max(fractions) - min(fractions))
        self.paused += paused
        self.live += live


def quantiles(values: Sequence[float]) -> dict[str, float]:
    return {f"p{q}": round(_rank(values, q), 4) for q in (50, 95, 99)}


def _rank(values: Sequence[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[max(1, math.ceil(q / 100 * len(ordered))) - 1]


@dataclass
class RunTotals:
    records: list[RequestRecord]
    program_latencies: list[float]
    samples: Samples
    prefill_tokens: int
    elapsed_s: float
    policy_switches: int = 0
    rollbacks: int = 0


def _waits(records: Sequence[RequestRecord], end_s: float) -> dict[str, float]:
    waits = [(end_s if r.first_token is None else r.first_token) - r.arrival for r in records]
    return {**quantiles(waits), "max": round(max(waits, default=0.0), 4)}


def result_row(totals: RunTotals, policy: str, ordering: str, wall_s: float) -> dict[str, Any]:
    done = [r for r in totals.records if r.finish is not None and r.first_token is not None]
    comps = [r.completion() for r in done]
    minutes, secs = max(totals.elapsed_s, 1e-9) / 60.0, max(totals.elapsed_s, 1e-9)
    ideal = sum(r.ideal_cached for r in done)
    hits = sum(min(r.cached_tokens, r.ideal_cached) for r in done)
    first_pass = sum(r.prompt_tokens - r.cached_tokens for r in done)
    missed = sum(max(0, r.ideal_cached - r.cached_tokens) for r in done)
    # Prefill beyond each prompt's first uncached pass is preemption recompute.
    preempt_redo = max(0, totals.prefill_tokens - first_pass)
    imb = totals.samples.imbalance
    return {
        "policy": policy,
        "ordering": ordering,
        "completed_steps": len(done),
        "completed_programs": len(totals.program_latencies),
        "elapsed_s": round(totals.elapsed_s, 3),
        "throughput_steps_per_min": round(len(done) / minutes, 3),
        "output_tokens_per_s": round(sum(r.output_tokens for r in done) / secs, 2),
        "program_latency_s": quantiles(totals.program_latencies),
        "prefix_hit_rate": round(hits / ideal, 4) if ideal else 1.0,
        "recomputed_prompt_tokens": missed + preempt_redo,
        "preemptions": sum(r.preemptions for r in done),
        "paused_share": round(totals.samples.paused / totals.samples.live, 4)
        if totals.samples.live else 0.0,
        "kv_imbalance": {
            "mean": round(sum(imb) / len(imb), 4) if imb else 0.0,
            "peak": round(max(imb), 4) if imb else 0.0,
        },
        "goodput_rps": round(slo_metrics.goodput(comps, secs), 4),
        "esg": round(slo_metrics.esg(comps), 1),
        "esg_ratio": round(slo_metrics.esg_ratio(comps), 4),
        "slo_attainment": round(slo_metrics.slo_attainment(comps), 4),
        "ttft_compliance": round(slo_metrics.ttft_compliance(comps), 4),
        "tpot_compliance": round(slo_metrics.tpot_compliance(comps), 4),
        "ttft_s": quantiles([c.ttft_s for c in comps]),
        # Ready to first token, counting requests still unserved at the end as waiting
        # until then: what a wait bound (force-resume) promises, for every policy alike.
        "wait_s": _waits(totals.records, totals.elapsed_s),
        "unserved_requests": sum(1 for r in totals.records if r.first_token is None),
        "policy_switches": totals.policy_switches,
        "rollbacks": totals.rollbacks,
        "simulated": True,
        "wall_s": round(wall_s, 3),
    }
