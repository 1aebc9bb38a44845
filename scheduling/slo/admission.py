"""Statera agent (H-MAS Sec. 3.4.2, Appendix B.3 and E.2, Algorithm 2): a conformal admission
fence plus two control loops that keep utilisation inside a band.

- Conformal bound: l_upper = l_pred + q_{1-eps}(D_b), D_b the last errors l_real - l_pred of
  the request's prompt-length bucket, q the split-conformal quantile with the finite-sample
  rank ceil((n + 1)(1 - eps)). Until a bucket has enough errors for that rank to exist, the
  bound is the request's token cap: unknown risk is treated as maximal risk.
- Fence (Eq. 2): admit r on a worker only if the reserved KV of its running requests plus
  m_KV(r) stays within M_cap (1 - delta_frag), and fewer than N_run are running there.
- Inner loop (P): B_token <- clip(B_token - eta_B e_t), e_t the distance of the
  window-averaged utilisation from the band [u_low, u_high].
- Outer loop (I): N_run <- clip(N_run - eta_N mean(e over the last W cycles)).
- Decode pressure (optional): the inner loop tracks the larger of the utilisation error and
  the error of TPOT over its SLO against ``tpot_band`` (the paper's "optionally short-window
  violation indicators"); the outer loop stays on utilisation.

Keep one ``StateraAgent`` per worker and call ``step`` once per scheduling cycle.

vLLM takes no per-cycle token budget (``max_num_batched_tokens`` is fixed when the engine
starts), so on vLLM workers only the admission fence and N_run are enforced, N_run through
how many requests the daemon dispatches; B_token is honoured only by the simulated engine.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from scheduling.slo.prediction import QueuedRequest, prompt_bucket


def conformal_quantile(errors: list[float], epsilon: float) -> float | None:
    """The ceil((n+1)(1-eps))-th smallest error, or None when that rank exceeds n."""
    n = len(errors)
    rank = math.ceil((n + 1) * (1.0 - epsilon))
    if n == 0 or rank > n:
        return None
    return sorted(errors)[max(rank, 1) - 1]


class ConformalCalibrator:
    """Bucketed error buffers D_b and the per-request upper bound l_upper."""

    def __init__(self, epsilon: float = 0.05, window: int = 512, max_tokens: int = 4096) -> None:
        if not 0.0 < epsilon < 1.0:
            raise ValueError("epsilon must be in (0, 1)")
        self.epsilon = epsilon
        self.max_tokens = max_tokens
        self._window = window
        self._errors: dict[int, deque[float]] = {}

    def observe(self, prompt_tokens: int, l_pred: int, l_real: int) -> None:
        """Event hook: a request finished; record e = l_real - l_pred in its bucket."""
        bucket = self._errors.setdefault(prompt_bucket(prompt_tokens), deque(maxlen=self._window))
        bucket.append(float(l_real - l_pred))

    def quantile(self, prompt_tokens: int) -> float | None:
        errors = self._errors.get(prompt_bucket(prompt_tokens))
        return conformal_quantile(list(errors), self.epsilon) if errors else None

    def upper(self, prompt_tokens: int, l_pred: int, max_tokens: int | None = None) -> int:
        cap = self.max_tokens if max_tokens is None else max_tokens
        q = self.quantile(prompt_tokens)
        if q is None:
            return cap
        return min(cap, max(1, l_pred + math.ceil(q)))


def kv_demand(request: QueuedRequest) -> int:
    """m_KV(l_upper) in KV tokens: the prompt plus the bounded output (prefix hits ignored,
    which only over-reserves)."""
    return request.prompt_tokens + request.l_upper


@dataclass(frozen=True, slots=True)
class ExecutionControls:
    """C_t for one worker. ``unbounded`` is the emergency-bypass mode: admit everything."""

    token_budget: int
    n_run: int
    unbounded: bool = False


@dataclass(frozen=True, slots=True)
class AdmissionDecision:
    request_id: str
    worker: str
    admit: bool
    reason: str
    demand_tokens: int
    reserved_tokens: int
    budget_tokens: float


class AdmissionFence:
    """Per-worker ledger of reserved KV; ``decide`` checks Eq. 2 and the N_run cap.

    Feed ``set_capacity`` when a worker registers or reports, ``on_admitted`` when the daemon
    dispatches an admitted request and ``on_finished`` when it ends, aborts or is preempted.
    """

    def __init__(self, delta_frag: float = 0.1) -> None:
        self.delta_frag = delta_frag
        self._capacity: dict[str, int] = {}
        self._reserved: dict[str, dict[str, int]] = {}

    def set_capacity(self, worker: str, m_cap_tokens: int) -> None:
        self._capacity[worker] = m_cap_tokens
        self._reserved.setdefault(worker, {})

    def on_admitted(self, worker: str, request_id: str, demand_tokens: int) -> None:
        self._reserved.setdefault(worker, {})[request_id] = demand_tokens

    def on_finished(self, worker: str, request_id: str) -> None:
        self._reserved.get(worker, {}).pop(request_id, None)

    def reserved(self, worker: str) -> int:
        return sum(self._reserved.get(worker, {}).values())

    def running(self, worker: str) -> int:
        return len(self._reserved.get(worker, {}))

    def decide(
        self, request: QueuedRequest, worker: str, controls: ExecutionControls
    ) -> AdmissionDecision:
        demand, reserved = kv_demand(request), self.reserved(worker)
        budget = self._capacity.get(worker, 0) * (1.0 - self.delta_frag)
        admit, reason = self._verdict(demand, reserved, budget, worker, controls)
        rid = request.request_id
        return AdmissionDecision(rid, worker, admit, reason, demand, reserved, budget)

    def _verdict(
        self, demand: int, reserved: int, budget: float, worker: str, controls: ExecutionControls
    ) -> tuple[bool, str]:
        if controls.unbounded:
            return True, "emergency bypass: admission unbounded"
        if self.running(worker) >= controls.n_run:
            return False, f"N_run cap reached ({self.running(worker)}/{controls.n_run} running)"
        if reserved + demand > budget:
            return False, f"KV fence: {reserved}+{demand} tokens > budget {budget:.0f}"
        return True, f"KV fence: {reserved}+{demand} tokens <= budget {budget:.0f}"


@dataclass(frozen=True, slots=True)
class Band:
    """The target utilisation band [low, high]."""

    low: float
    high: float

    def error(self, utilisation: float) -> float:
        """u - proj_band(u): zero inside the band, signed distance outside."""
        return utilisation - min(self.high, max(self.low, utilisation))


class TokenBudgetController:
    """Inner loop: B <- clip(B - eta * e). Clipping the state itself is the anti-windup."""

    def __init__(self, b_min: int, b_max: int, eta: float) -> None:
        self.b_min, self.b_max, self.eta = b_min, b_max, eta
        self._value = float(b_max)

    @property
    def value(self) -> int:
        return round(self._value)

    def update(self, error: float) -> int:
        self._value = min(self.b_max, max(self.b_min, self._value - self.eta * error))
        return self.value


class ConcurrencyController:
    """Outer loop: N <- clip(N - eta * mean(e over W cycles)); the state is clipped, so a long
    saturated phase cannot wind up and delay the recovery by more than the W-cycle mean."""

    def __init__(self, n_min: int, n_max: int, eta: float, window: int = 10) -> None:
        self.n_min, self.n_max, self.eta = n_min, n_max, eta
        self._value = float(n_max)
        self._errors: deque[float] = deque(maxlen=window)

    @property
    def value(self) -> int:
        return round(self._value)

    def update(self, error: float) -> int:
        self._errors.append(error)
        mean = sum(self._errors) / len(self._errors)
        self._value = min(self.n_max, max(self.n_min, self._value - self.eta * mean))
        return self.value


class StateraAgent:
    """Runs both loops once per cycle on the short view's window-averaged utilisation and,
    when given, the decode pressure: inter-token time over the TPOT SLO of what is running.

    The token budget follows the more loaded of the two signals: KV utilisation alone never
    sees the long prefill steps that stretch every decoding request's TPOT, and shrinking
    the per-cycle token budget is what shortens those steps."""

    def __init__(
        self, band: Band, budget: TokenBudgetController, concurrency: ConcurrencyController,
        tpot_band: Band = Band(0.7, 0.95),
    ) -> None:
        self.band, self.budget, self.concurrency = band, budget, concurrency
        self.tpot_band = tpot_band

    def step(
        self, utilisation: float, bypass: bool = False, tpot_ratio: float | None = None
    ) -> ExecutionControls:
        # Under bypass the loops hold still: integrating the overload that triggered the bypass
        # would leave N_run pinned low long after the guard clears.
        if bypass:
            return ExecutionControls(self.budget.b_max, self.concurrency.n_max, unbounded=True)
        error = self.band.error(utilisation)
        pressure = error if tpot_ratio is None else max(error, self.tpot_band.error(tpot_ratio))
        # Only the budget answers decode pressure: a step's length is set by the prefill
        # tokens it carries, while cutting N_run would cost decode batch for nothing.
        return ExecutionControls(self.budget.update(pressure), self.concurrency.update(error))
