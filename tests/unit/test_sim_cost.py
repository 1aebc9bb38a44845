"""Cost model arithmetic, JSON round trip and the shipped files."""

from __future__ import annotations

from pathlib import Path

import pytest

from daemon.engines.sim.cost import (
    DEFAULT_COST_MODEL,
    CostModel,
    load_cost_model,
    prefill_pairs,
    shipped_cost_models,
)
from daemon.engines.sim.scheduler import SchedulerConfig, SimRequest, SimScheduler

UNIT = CostModel(name="unit", c0=1.0, c_prefill=0.1, c_decode=0.01, c_attn=0.001, c_pf=0.0001)


def test_step_time_formula() -> None:
    assert UNIT.step_time(0, 0, 0) == 0.0
    got = UNIT.step_time(prefill_tokens=20, decode_seqs=3, context_tokens=500, prefill_pairs=1000)
    assert got == pytest.approx(1.0 + 2.0 + 0.03 + 0.5 + 0.1)
    assert prefill_pairs(8, 10) == 8 * (10 + 4)


def test_scheduler_step_duration_uses_the_batch_it_scheduled() -> None:
    sched = SimScheduler(
        SchedulerConfig(block_size=4, num_blocks=64, max_num_batched_tokens=16), UNIT
    )
    sched.add_request(SimRequest(request_id="d", prompt_token_ids=list(range(6)), max_tokens=9))
    first = sched.step()  # prefill 6 tokens from nothing
    assert first.duration_s == pytest.approx(1.0 + 0.1 * 6 + 0.001 * 6 + 0.0001 * 6 * 3)
    sched.add_request(SimRequest(request_id="p", prompt_token_ids=[*range(50, 70)], max_tokens=1))
    mixed = sched.step()  # "d" decodes (context 7), "p" prefills a 15-token chunk
    assert (mixed.num_decode_seqs, mixed.num_prefill_tokens) == (1, 15)
    assert mixed.num_context_tokens == 7 + 15
    want = 1.0 + 0.1 * 15 + 0.01 * 1 + 0.001 * 22 + 0.0001 * 15 * 7.5
    assert mixed.duration_s == pytest.approx(want)


def test_json_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "cm.json"
    model = CostModel(name="x", c0=0.01, c_prefill=1e-5, c_decode=2e-5, c_attn=3e-8,
                      source="test", defaults={"max_batch": 8})
    model.save(path)
    assert load_cost_model(str(path)) == model
    path.write_text('{"name": "x", "c0": 1, "c_prefill": 0, "c_decode": 0, "c_attn": 0, "z": 1}')
    with pytest.raises(ValueError, match="unknown"):
        CostModel.load(path)
    with pytest.raises(FileNotFoundError):
        load_cost_model("no-such-model")


def test_shipped_models() -> None:
    assert {"llama3-8b-h100", DEFAULT_COST_MODEL} <= set(shipped_cost_models())
    llama = load_cost_model("llama3-8b-h100")
    assert "gpu-costs.md" in llama.source
    # The published points it was fitted to: ~7.2 ms decode at batch 1, ~23.5 ms for a 1k prefill.
    assert llama.step_time(0, 1, 500) == pytest.approx(7.2e-3, rel=0.1)
    prefill_1k = llama.step_time(1024, 0, 1024, prefill_pairs(1024, 0))
    assert prefill_1k == pytest.approx(23.5e-3, rel=0.15)
    cpu = load_cost_model()
    assert cpu.name == DEFAULT_COST_MODEL and "agentd calibrate" in cpu.source
    assert "uncalibrated" not in cpu.source.lower()
    # Fitted on this 2-core machine under load: SmolLM2 decodes one stream at 5-30 tok/s.
    assert 5 <= 1.0 / cpu.step_time(0, 1, 300) <= 30
