"""bench-agentic-real's workload and table: agents scaled from trace sessions, ratios taken
per round against vllm-default and the best other policy."""

from __future__ import annotations

from bench.agentic_real import agents_from_trace, summarise
from daemon.replay.workload import ProgramSpec, StepSpec


def _spec(sid: str, steps: int) -> ProgramSpec:
    return ProgramSpec(sid, 0.0, tuple(StepSpec(2000 + 600 * i, 200, 2000 if i == 0 else 800,
                                                tool_s=20.0) for i in range(steps)),
                       meta={"session": sid})


def test_agents_take_the_first_sessions_long_enough_and_scale_them() -> None:
    specs = [_spec("short", 2), _spec("a", 6), _spec("b", 8)]
    a, b = agents_from_trace(specs, 2, 4, context_scale=0.1, output_scale=0.5, tool_scale=0.1)
    assert (a.session, b.session, len(a.steps)) == ("a", "b", 4)
    assert a.system_tokens == 200  # 2000 x 0.1
    first, second = a.steps[0], a.steps[1]
    assert (first.observation_tokens, first.output_tokens) == (0, 96)  # 100 capped at 96
    assert second.observation_tokens == 60  # (800 new - 200 output) x 0.1
    assert second.tool_s == 2.0


def _row(policy: str, rnd: int, steps_per_min: float) -> dict[str, object]:
    return {"policy": policy, "round": rnd, "steps_per_min": steps_per_min,
            "step_latency_s": {"p99": 1.0}, "program_latency_s": {"p50": 1.0, "p99": 2.0},
            "prefix_hit_rate": 0.5, "recomputed_prompt_tokens": 10,
            "sim": {"steps_per_min": steps_per_min, "error": 0.0}}


def test_ratios_are_per_round_against_the_baseline_and_the_best_other_policy() -> None:
    rows = [_row("vllm-default", 0, 10), _row("agentd", 0, 15), _row("continuum-ttl", 0, 12),
            _row("vllm-default", 1, 20), _row("agentd", 1, 20), _row("continuum-ttl", 1, 25)]
    s = summarise(rows, ("vllm-default", "continuum-ttl", "agentd"))
    assert s["agentd"]["vs_vllm_default"] == {"mean": 1.25, "worst": 1.0}
    assert s["agentd"]["vs_best_other"] == {"mean": 1.025, "worst": 0.8}
    assert s["agentd"]["steps_per_min"] == 17.5
