"""Fitting of `agentd calibrate`: recovers known constants from synthetic step times."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest

from daemon.commands.calibrate import (
    COLUMNS,
    StepSample,
    decode_sample,
    fit_constants,
    fit_cost_model,
    nnls,
    relative_errors,
)
from daemon.engines.sim.cost import CostModel, load_cost_model, prefill_pairs

TRUE = CostModel(name="true", c0=0.03, c_prefill=4e-4, c_decode=6e-3, c_attn=2e-6, c_pf=3e-8)


def grid_samples(model: CostModel, noise: float = 0.0, seed: int = 0) -> list[StepSample]:
    rng = random.Random(seed)
    out: list[StepSample] = []

    def add(kind: str, pf: int, dec: int, ctx: int, pairs: float) -> None:
        t = model.step_time(pf, dec, ctx, pairs) * (1 + rng.uniform(-noise, noise))
        out.append(StepSample(kind, pf, dec, ctx, pairs, t))

    for n in (32, 128, 256, 512, 1024):
        add("prefill", n, 0, n, prefill_pairs(n, 0))
    for p, n in ((512, 128), (1024, 256)):
        add("cached_prefill", n, 0, p + n, prefill_pairs(n, p))
    for c in (32, 256, 640):
        for b in (1, 2, 4, 8):
            add("decode", 0, b, b * (c + 10), 0.0)
    return out


def test_exact_data_recovers_constants() -> None:
    fitted = fit_constants(grid_samples(TRUE))
    for k in COLUMNS:
        assert fitted[k] == pytest.approx(getattr(TRUE, k), rel=1e-6)


def test_noisy_data_recovers_constants_within_tolerance() -> None:
    samples = grid_samples(TRUE, noise=0.02, seed=3)
    model = fit_cost_model(samples, "fit", "synthetic")
    # The dominant terms come back closely; every modelled step within the noise band.
    assert model.c0 == pytest.approx(TRUE.c0, rel=0.15)
    assert model.c_prefill == pytest.approx(TRUE.c_prefill, rel=0.15)
    assert model.c_decode == pytest.approx(TRUE.c_decode, rel=0.15)
    assert max(abs(e) for e in relative_errors(model, samples)) < 0.05


def test_constants_stay_non_negative() -> None:
    # A true model with no attention cost plus noise would pull c_attn below zero in plain OLS.
    flat = CostModel(name="flat", c0=0.05, c_prefill=5e-4, c_decode=4e-3, c_attn=0.0, c_pf=0.0)
    fitted = fit_constants(grid_samples(flat, noise=0.05, seed=7))
    assert all(v >= 0 for v in fitted.values())
    assert fitted["c0"] == pytest.approx(0.05, rel=0.25)


def test_nnls_matches_lstsq_when_unconstrained() -> None:
    rng = np.random.default_rng(0)
    a = rng.uniform(0.1, 1.0, size=(20, 3))
    x = np.array([1.0, 2.0, 0.5])
    assert nnls(a, a @ x) == pytest.approx(x, rel=1e-8)


def test_nnls_clamps_negative_component() -> None:
    a = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    b = np.array([1.0, -1.0, 0.0])
    x = nnls(a, b)
    assert x[1] == 0.0 and x[0] >= 0


def test_too_few_samples_is_an_error() -> None:
    with pytest.raises(ValueError, match="at least"):
        fit_constants(grid_samples(TRUE)[:3])


def test_fitted_model_round_trips_through_json(tmp_path: Path) -> None:
    model = fit_cost_model(grid_samples(TRUE), "smol", "synthetic test", {"block_size": 128})
    path = tmp_path / "smol.json"
    model.save(path)
    assert load_cost_model(str(path)) == model


def test_decode_sample_takes_steady_gaps_of_the_last_started_request() -> None:
    # Request a starts at 0.1 and b at 0.3; decode steps of 0.1 s once both run.
    a = [0.1, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9]
    b = [0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0]
    s = decode_sample([a, b], batch=2, context=10, quantile=0.5)
    assert s is not None
    assert s.decode_seqs == 2 and s.seconds == pytest.approx(0.1)
    assert s.context_tokens > 20


def test_decode_sample_low_quantile_ignores_stalled_steps() -> None:
    a = [0.0, 0.1, 0.2, 1.2, 1.3, 2.3, 2.4, 2.5, 2.6, 2.7]
    s = decode_sample([a], batch=1, context=10, quantile=0.25)
    assert s is not None and s.seconds == pytest.approx(0.1)


def test_decode_sample_without_steady_steps_is_none() -> None:
    assert decode_sample([[0.1, 0.2], [0.3, 0.4]], batch=2, context=10) is None


def test_shipped_smollm2_model_is_calibrated() -> None:
    model = load_cost_model("smollm2-135m-cpu")
    assert "agentd calibrate" in model.source and "UNCALIBRATED" not in model.source
