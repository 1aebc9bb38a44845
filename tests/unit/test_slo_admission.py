"""Conformal bound coverage, the KV admission fence and the P/I control loops."""

from __future__ import annotations

import random

import pytest

from scheduling.slo.admission import (
    AdmissionFence,
    Band,
    ConcurrencyController,
    ConformalCalibrator,
    ExecutionControls,
    StateraAgent,
    TokenBudgetController,
    conformal_quantile,
)
from scheduling.slo.prediction import QueuedRequest
from scheduling.slo.templates import Slo, TaskType


def test_conformal_rank_uses_finite_sample_correction() -> None:
    errors = [float(i) for i in range(1, 20)]  # n = 19, eps = 0.05: rank ceil(20 * 0.95) = 19
    assert conformal_quantile(errors, 0.05) == 19.0
    assert conformal_quantile(errors[:18], 0.05) is None  # rank 19 > n = 18: no finite bound
    assert conformal_quantile(errors, 0.5) == 10.0  # ceil(20 * 0.5) = 10
    assert conformal_quantile([], 0.1) is None


def test_calibrator_is_conservative_until_it_has_data() -> None:
    cal = ConformalCalibrator(epsilon=0.1, max_tokens=2048)
    assert cal.upper(100, 50) == 2048
    assert cal.upper(100, 50, max_tokens=300) == 300
    for e in range(20):
        cal.observe(100, 50, 50 + e)
    assert cal.upper(100, 50) == 50 + 18  # rank ceil(21 * 0.9) = 19 -> error 18
    assert cal.upper(5000, 50) == 2048  # another prompt bucket has no errors yet


@pytest.mark.parametrize("epsilon", [0.05, 0.1, 0.2])
def test_conformal_bound_covers_at_the_target_rate(epsilon: float) -> None:
    rng = random.Random(7)

    def true_length(l_pred: int) -> int:
        return max(1, round(l_pred * rng.lognormvariate(0.0, 0.6)))

    cal = ConformalCalibrator(epsilon=epsilon, window=500, max_tokens=10**9)
    for _ in range(500):
        l_pred = rng.randint(50, 400)
        cal.observe(300, l_pred, true_length(l_pred))
    trials = 4000
    covered = 0
    for _ in range(trials):
        l_pred = rng.randint(50, 400)
        covered += true_length(l_pred) <= cal.upper(300, l_pred)
    coverage = covered / trials
    assert 1 - epsilon - 0.03 <= coverage <= 1 - epsilon + 0.05


def _req(rid: str, prompt: int, l_upper: int) -> QueuedRequest:
    return QueuedRequest(
        rid, "t", 0.0, prompt, TaskType.QA, 0.75, Slo(1.0, 0.1), l_upper // 2, l_upper, 0.1, 0.01
    )


def test_fence_admits_within_budget_and_refuses_past_it() -> None:
    fence = AdmissionFence(delta_frag=0.1)
    fence.set_capacity("w0", 1000)  # budget 900 tokens
    controls = ExecutionControls(token_budget=512, n_run=8)
    first = fence.decide(_req("a", 100, 400), "w0", controls)
    assert first.admit and first.demand_tokens == 500
    fence.on_admitted("w0", "a", first.demand_tokens)
    second = fence.decide(_req("b", 100, 350), "w0", controls)
    assert not second.admit and "fence" in second.reason and second.reserved_tokens == 500
    fence.on_finished("w0", "a")
    assert fence.decide(_req("b", 100, 350), "w0", controls).admit


def test_fence_enforces_n_run_and_bypass_is_unbounded() -> None:
    fence = AdmissionFence()
    fence.set_capacity("w0", 10**6)
    fence.on_admitted("w0", "a", 10)
    fence.on_admitted("w0", "b", 10)
    capped = fence.decide(_req("c", 1, 2), "w0", ExecutionControls(512, n_run=2))
    assert not capped.admit and "N_run" in capped.reason
    fence.set_capacity("w1", 0)
    bypass = fence.decide(_req("c", 100, 100), "w1", ExecutionControls(512, 1, unbounded=True))
    assert bypass.admit and "bypass" in bypass.reason


def test_band_error_is_zero_inside_and_signed_outside() -> None:
    band = Band(0.6, 0.8)
    assert band.error(0.7) == 0.0
    assert band.error(0.9) == pytest.approx(0.1)
    assert band.error(0.5) == pytest.approx(-0.1)


def test_p_controller_brings_utilisation_into_band_after_a_load_step() -> None:
    band, ctl = Band(0.6, 0.8), TokenBudgetController(b_min=64, b_max=1000, eta=200)

    def plant(budget: int, load: float) -> float:
        return load * budget / 1000

    for _ in range(5):
        assert ctl.update(band.error(plant(ctl.value, 0.7))) == 1000  # in band: untouched
    for _ in range(60):
        ctl.update(band.error(plant(ctl.value, 1.5)))
    assert band.low <= plant(ctl.value, 1.5) <= band.high + 0.01


def test_p_controller_clamps_at_both_ends() -> None:
    ctl = TokenBudgetController(b_min=64, b_max=1000, eta=500)
    for _ in range(50):
        ctl.update(5.0)
    assert ctl.value == 64
    for _ in range(50):
        ctl.update(-5.0)
    assert ctl.value == 1000


def test_i_controller_converges_on_a_step() -> None:
    band, ctl = Band(0.6, 0.8), ConcurrencyController(n_min=1, n_max=64, eta=10, window=4)

    def plant(n_run: int) -> float:
        return min(1.0, n_run * 0.025)  # 40% of sequences saturate the device

    for _ in range(200):
        ctl.update(band.error(plant(ctl.value)))
    assert band.low - 0.03 <= plant(ctl.value) <= band.high + 0.03


def test_i_controller_does_not_wind_up_while_clamped() -> None:
    ctl = ConcurrencyController(n_min=2, n_max=32, eta=4, window=5)
    for _ in range(500):
        ctl.update(1.0)
    assert ctl.value == 2
    steps_to_rise = next(i for i in range(1, 50) if ctl.update(-1.0) > 2)
    assert steps_to_rise <= 5  # bounded by the averaging window, not by 500 cycles of history


def test_statera_holds_loops_still_during_bypass() -> None:
    agent = StateraAgent(
        Band(0.6, 0.8), TokenBudgetController(64, 1000, 200), ConcurrencyController(1, 64, 10)
    )
    normal = agent.step(0.99)
    assert not normal.unbounded and normal.token_budget < 1000
    held = agent.budget.value, agent.concurrency.value
    bypass = agent.step(0.99, bypass=True)
    assert bypass.unbounded and (bypass.token_budget, bypass.n_run) == (1000, 64)
    assert (agent.budget.value, agent.concurrency.value) == held


def test_decode_pressure_drives_the_budget_but_not_n_run() -> None:
    """KV utilisation inside its band, inter-token time at twice the TPOT SLO: the token
    budget falls until the pressure is gone, N_run stays; with the pressure gone and KV
    below the band the budget climbs back."""
    agent = StateraAgent(Band(0.5, 0.9), TokenBudgetController(256, 8192, 4096),
                         ConcurrencyController(4, 256, 64), tpot_band=Band(0.7, 0.95))
    budgets = [agent.step(0.6, tpot_ratio=2.0) for _ in range(5)]
    assert budgets[-1].token_budget == 256 and budgets[0].token_budget < 8192
    assert all(c.n_run == 256 for c in budgets)
    assert agent.step(0.6, tpot_ratio=0.8).token_budget == 256  # inside the band: hold
    assert agent.step(0.2, tpot_ratio=0.2).token_budget > 256
    # Without the pressure signal the agent is the utilisation-only controller it was.
    plain = StateraAgent(Band(0.5, 0.9), TokenBudgetController(256, 8192, 4096),
                         ConcurrencyController(4, 256, 64))
    assert plain.step(0.6).token_budget == 8192
