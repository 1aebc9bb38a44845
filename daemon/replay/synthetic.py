"""Synthetic agent programs whose shape is fitted to TraceLab's coding-agent session.

Fitted from ``tracelab_example_round_trace.jsonl`` (2 sessions, 19 rounds) by
``fit_tracelab``; every size is a lognormal given as (mu, sigma) of the natural log:

- first prompt (system prompt + task) tokens: (9.761, 0.621): median 17.3k, spans 9k-32k;
- tokens appended per later round (tool results, user turns): (7.095, 1.029), median 1.2k;
- output tokens per round: (5.774, 1.131), median 322;
- tool time after a round: none with probability 0.263, else (-0.183, 2.45) seconds,
  median 0.83 s, mean 16.8 s: most tools are quick shell commands, a few are web searches
  and file writes of 10-20 s. Draws are capped at ``max_tool_s``;
- rounds per program: the sessions had 10 and 9; two samples fix the mean (9.5) but not
  the spread, so the count is lognormal around 9.5 with an assumed sigma of 0.35.

Programs of one generator share a system prompt of ``shared_prefix_tokens`` (one prefix
group), as agents of one product do; their first prompt starts with it.
"""

from __future__ import annotations

import json
import math
import random
import statistics
from dataclasses import dataclass
from pathlib import Path

from daemon.replay.traces import round_tool_s
from daemon.replay.workload import ProgramSpec, StepSpec

LogNormal = tuple[float, float]


@dataclass(frozen=True)
class AgentShape:
    first_prompt: LogNormal = (9.761, 0.621)
    appended: LogNormal = (7.095, 1.029)
    output: LogNormal = (5.774, 1.131)
    tool_zero_p: float = 0.263
    tool_s: LogNormal = (-0.183, 2.45)
    steps_mean: float = 9.5
    steps_sigma: float = 0.35
    max_tool_s: float = 60.0
    max_output: int = 4096
    max_context: int = 64_000
    shared_prefix_tokens: int = 2048


def _lognormal(rng: random.Random, p: LogNormal) -> float:
    return rng.lognormvariate(p[0], p[1])


def synthetic_programs(
    n: int, seed: int = 0, shape: AgentShape | None = None, arrival_rate: float | None = None
) -> list[ProgramSpec]:
    """``n`` programs; with ``arrival_rate`` (per s) they arrive as a Poisson process,
    else all at time 0 (a closed loop admits them as slots free up)."""
    shape = shape or AgentShape()
    rng = random.Random(seed)
    at, out = 0.0, []
    for i in range(n):
        if arrival_rate:
            at += rng.expovariate(arrival_rate)
        out.append(_program(rng, f"syn{seed}-{i}", at, shape))
    return out


def _program(rng: random.Random, pid: str, at: float, shape: AgentShape) -> ProgramSpec:
    drawn = rng.lognormvariate(math.log(shape.steps_mean), shape.steps_sigma)
    count = max(2, min(40, round(drawn)))
    prompt = max(shape.shared_prefix_tokens + 16, round(_lognormal(rng, shape.first_prompt)))
    steps: list[StepSpec] = []
    for k in range(count):
        output = max(1, min(shape.max_output, round(_lognormal(rng, shape.output))))
        if k == 0:
            steps.append(StepSpec(prompt, output, prompt))
        else:
            new = max(1, round(_lognormal(rng, shape.appended)))
            prompt = steps[-1].prompt_tokens + steps[-1].output_tokens + new
            if prompt + output > shape.max_context:
                break
            steps.append(StepSpec(prompt, output, new, _tool_time(rng, shape)))
    return ProgramSpec(pid, at, tuple(steps), tenant="agents", task="code_generation",
                       prefix_group="agents", prefix_tokens=shape.shared_prefix_tokens)


def _tool_time(rng: random.Random, shape: AgentShape) -> float:
    if rng.random() < shape.tool_zero_p:
        return 0.0
    return min(shape.max_tool_s, _lognormal(rng, shape.tool_s))


def _fit(values: list[float]) -> LogNormal:
    logs = [math.log(v) for v in values if v > 0]
    return (round(statistics.fmean(logs), 3), round(statistics.pstdev(logs), 3))


def fit_tracelab(path: str | Path) -> AgentShape:
    """The fit documented above, recomputed from a TraceLab round trace."""
    rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    sessions: dict[str, int] = {}
    firsts: list[float] = []
    appended: list[float] = []
    tools: list[float] = []
    for r in rows:
        sessions[r["session_id"]] = sessions.get(r["session_id"], 0) + 1
        target = firsts if int(r["round_index"]) == 0 else appended
        target.append(float(r["input_tokens_total" if target is firsts else "newly_append_tokens"]))
        tools.append(round_tool_s(r))
    busy = [t for t in tools if t > 0]
    return AgentShape(
        first_prompt=_fit(firsts),
        appended=_fit(appended),
        output=_fit([max(1.0, float(r["output_tokens"])) for r in rows]),
        tool_zero_p=round(1 - len(busy) / len(tools), 3),
        tool_s=_fit(busy),
        steps_mean=statistics.fmean(sessions.values()),
    )
