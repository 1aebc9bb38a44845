"""Virtual-time driver: clock arithmetic and per-request timings."""

from __future__ import annotations

import pytest

from daemon.engines.sim.cost import CostModel
from daemon.engines.sim.scheduler import SchedulerConfig, SimRequest, SimScheduler
from daemon.engines.sim.virtual import VirtualClock, VirtualDriver

COST = CostModel(name="t", c0=0.1, c_prefill=0.01, c_decode=0.0, c_attn=0.0)


def driver() -> VirtualDriver:
    cfg = SchedulerConfig(block_size=4, num_blocks=64, max_num_batched_tokens=8)
    return VirtualDriver(SimScheduler(cfg, COST), VirtualClock(100.0))


def test_steps_advance_the_clock_by_their_modelled_duration() -> None:
    d = driver()
    d.submit(SimRequest(request_id="r", prompt_token_ids=list(range(12)), max_tokens=3))
    steps = d.run_until_idle()
    # Chunks of 8 and 4 tokens (0.18 s, 0.14 s), then two decodes of 0.1 s.
    assert [round(s.end - s.start, 6) for s in steps] == [0.18, 0.14, 0.1, 0.1]
    t = d.timings["r"]
    assert t.ttft == pytest.approx(0.32)
    assert t.e2e == pytest.approx(0.52) and d.clock.now() == pytest.approx(100.52)
    assert t.tpot == pytest.approx(0.1)
    assert (t.finish_reason, t.prompt_tokens, t.output_tokens) == ("length", 12, 3)


def test_idle_driver_jumps_to_the_horizon_and_steps_are_atomic() -> None:
    d = driver()
    assert d.run_until(150.0) == [] and d.clock.now() == 150.0
    d.submit(SimRequest(request_id="r", prompt_token_ids=list(range(12)), max_tokens=3))
    steps = d.run_until(150.05)
    # The first step starts before the horizon and runs to its end past it.
    assert len(steps) == 1 and d.clock.now() == pytest.approx(150.18)
    d.submit(SimRequest(request_id="late", prompt_token_ids=[1], max_tokens=1))
    assert d.timings["late"].arrival == pytest.approx(150.18)
    d.run_until_idle()
    assert d.next_step_at() is None and d.timings["late"].finish_reason == "length"


def test_abort_records_the_time() -> None:
    d = driver()
    d.submit(SimRequest(request_id="r", prompt_token_ids=[1, 2], max_tokens=50))
    d.run_until(100.25)  # steps end at 100.12, 100.22 and (started before 100.25) 100.32
    assert d.abort("r") and not d.abort("r")
    t = d.timings["r"]
    assert t.finish_reason == "abort" and t.finish == pytest.approx(100.32)
    assert t.output_tokens == 3 and not d.scheduler.has_work()
