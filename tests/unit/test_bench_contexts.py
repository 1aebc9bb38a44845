"""bench.contexts' pure parts: the tool times it draws from a trace, the agents it builds,
and how it summarises phases into agents/s, latency percentiles and the target ratio."""

from __future__ import annotations

import random
from typing import Any

import pytest

from bench import contexts
from daemon.replay.workload import ProgramSpec, StepSpec


def test_the_pool_holds_the_gaps_after_each_sessions_first_step() -> None:
    specs = [ProgramSpec("a", 0.0, (StepSpec(10, 1, 10, 0.0), StepSpec(20, 1, 9, 30.0),
                                    StepSpec(30, 1, 9, 5.0))),
             ProgramSpec("b", 1.0, (StepSpec(10, 1, 10, 7.0),))]
    assert contexts.tool_latency_pool(specs) == [30.0, 5.0]


def test_tool_latencies_are_scaled_capped_and_seeded() -> None:
    pool = [10.0, 20.0, 100.0]
    drawn = contexts.draw_tool_latencies(pool, 200, 0.05, 2.0, random.Random(3))
    assert len(drawn) == 200
    assert set(drawn) == {0.5, 1.0, 2.0}  # 100 s x 0.05 = 5 s, capped at 2 s
    assert drawn == contexts.draw_tool_latencies(pool, 200, 0.05, 2.0, random.Random(3))
    assert drawn != contexts.draw_tool_latencies(pool, 200, 0.05, 2.0, random.Random(4))
    with pytest.raises(ValueError, match="no tool latencies"):
        contexts.draw_tool_latencies([], 8, 0.05, 2.0, random.Random(0))


def test_agents_are_eight_tool_calls_and_the_same_for_the_same_seed() -> None:
    def build(seed: int) -> list[contexts.Agent]:
        return contexts.make_agents([40.0], 3, seed, system_words=5, observation_words=4,
                                    tool_scale=0.05, tool_cap_s=2.0)

    agents = build(7)
    assert len(agents) == 3 and agents == build(7) and agents != build(8)
    for agent in agents:
        assert agent.tool_s == (2.0,) * contexts.TOOL_CALLS
        assert len(agent.observations) == contexts.TOOL_CALLS
        assert len(agent.system.split()) == 5
        assert all(len(o.split()) == 1 + 4 for o in agent.observations)  # "Observation:"


def row(mode: str, c: int, rnd: int, agents_per_s: float, latency: list[float],
        failed: int = 0, overhead: float | None = None) -> dict[str, Any]:
    return {"mode": mode, "concurrency": c, "round": rnd, "agents_per_s": agents_per_s,
            "latency_s": latency, "failed": failed, "overhead_s": overhead}


def test_summary_takes_the_ratio_per_round_at_the_highest_concurrency() -> None:
    rows = [row("program", 4, 0, 9.0, [1.0]), row("chat-program-id", 4, 0, 1.0, [1.0]),
            row("program", 8, 0, 2.0, [1.0, 3.0], overhead=0.5),
            row("chat-program-id", 8, 0, 1.0, [2.0, 2.0]),
            row("chat-plain", 8, 0, 4.0, [1.0]),
            row("program", 8, 1, 3.0, [5.0], failed=1, overhead=1.5),
            row("chat-program-id", 8, 1, 2.0, [4.0]), row("chat-plain", 8, 1, 1.0, [1.0])]
    s = contexts.summarise(rows)
    assert s["highest_concurrency"] == 8
    # Per round 2.0 and 1.5 (not the ratio of the means, 2.5 / 1.5): C=4 plays no part.
    assert s["program_vs_chat_program_id"] == {"mean": 1.75, "worst": 1.5}
    assert s["program_vs_chat_plain"] == {"mean": 1.75, "worst": 0.5}
    assert s["contexts_client_vs_chat_program_id"] is None  # that mode never ran
    assert s["target"] == contexts.TARGET and s["target_met"] is True
    program8 = s["by_mode"]["program"]["8"]
    assert program8["agents_per_s"] == 2.5 and program8["rounds"] == 2
    assert program8["failed"] == 1 and program8["overhead_s"] == 1.0
    assert program8["latency_p50_s"] == 3.0  # over every round's agents: 1, 3, 5
    assert s["by_mode"]["chat-program-id"]["8"]["overhead_s"] is None
    assert s["by_mode"]["contexts-client"] == {}


def test_a_target_short_of_the_ratio_is_not_met() -> None:
    rows = [row("program", 4, 0, 1.2, [1.0]), row("chat-program-id", 4, 0, 1.0, [1.0])]
    s = contexts.summarise(rows)
    assert s["program_vs_chat_program_id"] == {"mean": 1.2, "worst": 1.2}
    assert s["target_met"] is False


def test_percentiles() -> None:
    assert contexts.percentile([], 50) is None
    assert contexts.percentile([2.0], 99) == 2.0
    assert contexts.percentile([1.0, 2.0, 3.0, 4.0, 5.0], 50) == 3.0
    assert contexts.percentile([float(x) for x in range(1, 102)], 99) == 100.0
