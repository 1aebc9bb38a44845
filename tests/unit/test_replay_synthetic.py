"""The synthetic agent generator reproduces its fitted statistics."""

from __future__ import annotations

import itertools
import json
import math
import statistics
from pathlib import Path

from daemon.replay.synthetic import AgentShape, fit_tracelab, synthetic_programs


def test_statistics_match_the_shape() -> None:
    shape = AgentShape()
    specs = synthetic_programs(600, seed=3, shape=shape)
    firsts = [math.log(s.steps[0].prompt_tokens) for s in specs]
    outputs = [math.log(st.output_tokens) for s in specs for st in s.steps]
    tools = [st.tool_s for s in specs for st in s.steps[1:]]
    assert abs(statistics.fmean(firsts) - shape.first_prompt[0]) < 0.08
    assert abs(statistics.fmean(outputs) - shape.output[0]) < 0.1
    assert abs(sum(t == 0 for t in tools) / len(tools) - shape.tool_zero_p) < 0.04
    assert 7.5 < statistics.fmean(len(s.steps) for s in specs) < 10.5
    assert all(st.new_tokens < st.prompt_tokens for s in specs for st in s.steps[1:])


def test_seeded_and_arrivals() -> None:
    a = synthetic_programs(5, seed=1, arrival_rate=2.0)
    assert a == synthetic_programs(5, seed=1, arrival_rate=2.0)
    assert a != synthetic_programs(5, seed=2, arrival_rate=2.0)
    assert all(x.arrival_s < y.arrival_s for x, y in itertools.pairwise(a))


def test_fit_recovers_rounds(tmp_path: Path) -> None:
    rows = [{"session_id": f"s{s}", "round_index": i, "input_tokens_total": 1000 * (s + 1),
             "newly_append_tokens": 100, "output_tokens": 50,
             "tools": [{"tool_wall_latency_ms": 2000}] if i % 2 else []}
            for s in range(2) for i in range(4)]
    f = tmp_path / "r.jsonl"
    f.write_text("\n".join(json.dumps(r) for r in rows))
    shape = fit_tracelab(f)
    assert shape.steps_mean == 4
    assert shape.appended == (round(math.log(100), 3), 0.0)
    assert shape.tool_zero_p == 0.5 and shape.tool_s == (round(math.log(2), 3), 0.0)
