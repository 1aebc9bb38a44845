"""SLO outcome metrics, as defined by the H-MAS paper.

- A request succeeds iff TTFT <= SLO_ttft and TPOT <= SLO_tpot (Sec. 3.1 Eq. 1, Appendix B.2
  Eq. 8). SLO attainment is the paper's "Goodput Rate" (Eq. 9): the fraction that succeed;
  goodput ("Effective Goodput", Sec. 4.1) is the number that succeed per second.
- ESG (Sec. 4 "Metrics", Eq. 6, after Zhang et al. 2025):
  ESG = sum_r V_base * min(1, (SLO_ttlt / TTLT)^alpha), V_base = w_i L_in + w_o L_out,
  TTLT = TTFT + L_out * TPOT, with w_i = 1, w_o = 2, alpha = 1 (Appendix B.2). The paper
  names SLO_ttlt without defining it; consistently with TTLT we use
  SLO_ttlt = SLO_ttft + L_out * SLO_tpot.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

ESG_W_IN = 1.0
ESG_W_OUT = 2.0
ESG_ALPHA = 1.0


@dataclass(frozen=True, slots=True)
class CompletionRecord:
    """One finished request: what happened against what was promised. Times in seconds."""

    request_id: str
    tenant: str
    worker: str
    arrival_s: float
    finish_s: float
    prompt_tokens: int
    output_tokens: int
    ttft_s: float
    tpot_s: float
    slo_ttft_s: float
    slo_tpot_s: float
    task: str = "unknown"
    l_pred: int = 0

    @property
    def ttft_ok(self) -> bool:
        return self.ttft_s <= self.slo_ttft_s

    @property
    def tpot_ok(self) -> bool:
        return self.tpot_s <= self.slo_tpot_s

    @property
    def ok(self) -> bool:
        return self.ttft_ok and self.tpot_ok

    @property
    def ttlt_s(self) -> float:
        return self.ttft_s + self.output_tokens * self.tpot_s

    @property
    def slo_ttlt_s(self) -> float:
        return self.slo_ttft_s + self.output_tokens * self.slo_tpot_s


def _fraction(flags: Sequence[bool]) -> float:
    # An empty window met every SLO it was given: no evidence of violation.
    return sum(flags) / len(flags) if flags else 1.0


def ttft_compliance(records: Sequence[CompletionRecord]) -> float:
    return _fraction([r.ttft_ok for r in records])


def tpot_compliance(records: Sequence[CompletionRecord]) -> float:
    return _fraction([r.tpot_ok for r in records])


def slo_attainment(records: Sequence[CompletionRecord]) -> float:
    """The paper's Goodput Rate (Eq. 9)."""
    return _fraction([r.ok for r in records])


def goodput(records: Sequence[CompletionRecord], window_s: float) -> float:
    """Requests meeting both SLOs per second over a window of ``window_s`` seconds."""
    if window_s <= 0:
        raise ValueError("window_s must be positive")
    return sum(r.ok for r in records) / window_s


def base_value(record: CompletionRecord, w_in: float = ESG_W_IN, w_out: float = ESG_W_OUT) -> float:
    return w_in * record.prompt_tokens + w_out * record.output_tokens


def service_gain(record: CompletionRecord, alpha: float = ESG_ALPHA) -> float:
    """min(1, (SLO_ttlt / TTLT)^alpha); a zero-latency request keeps its full value."""
    return gain(record.slo_ttlt_s, record.ttlt_s, alpha)


def gain(slo_ttlt_s: float, ttlt_s: float, alpha: float = ESG_ALPHA) -> float:
    """The ESG discount of one request; shared with the orderings that predict it."""
    if ttlt_s <= 0:
        return 1.0
    return float(min(1.0, (slo_ttlt_s / ttlt_s) ** alpha))


def esg(
    records: Sequence[CompletionRecord],
    w_in: float = ESG_W_IN,
    w_out: float = ESG_W_OUT,
    alpha: float = ESG_ALPHA,
) -> float:
    return sum(base_value(r, w_in, w_out) * service_gain(r, alpha) for r in records)


def esg_ratio(records: Sequence[CompletionRecord]) -> float:
    """ESG over its maximum (every request on time), in [0, 1]: a load-independent reward."""
    best = sum(base_value(r) for r in records)
    return esg(records) / best if best > 0 else 1.0
