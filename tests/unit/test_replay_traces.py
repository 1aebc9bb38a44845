"""Trace loaders on tiny in-test fixtures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from daemon.replay.traces import TraceError, load_azure, load_trace
from daemon.replay.workload import block_prompt, first_prompt, next_prompt


def _jsonl(path: Path, rows: list[dict[str, object]]) -> Path:
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def test_programs_steps_and_shared_prefix(tmp_path: Path) -> None:
    f = _jsonl(tmp_path / "p.jsonl", [
        {"program_id": "a", "step": 1, "prompt_tokens": 150, "output_tokens": 5,
         "new_tokens": 30, "tool_s": 2.5},
        {"program_id": "a", "step": 0, "arrival_s": 3.0, "prompt_tokens": 100,
         "output_tokens": 20},
    ])
    (spec,) = load_trace(f, "programs")
    assert spec.arrival_s == 3.0
    assert [s.prompt_tokens for s in spec.steps] == [100, 150]
    assert spec.steps[1].new_tokens == 30 and spec.steps[1].tool_s == 2.5
    context = first_prompt(spec) + [99] * 20
    ids, shared = next_prompt(spec, 1, context)
    assert shared == 120 and ids[:120] == context[:120] and len(ids) == 150


def test_programs_rejects_missing_fields(tmp_path: Path) -> None:
    f = _jsonl(tmp_path / "bad.jsonl", [{"program_id": "a", "step": 0}])
    with pytest.raises(TraceError, match=r"bad\.jsonl:1"):
        load_trace(f, "programs")


def test_mooncake_equal_hash_ids_share_blocks(tmp_path: Path) -> None:
    f = _jsonl(tmp_path / "m.jsonl", [
        {"timestamp": 0, "input_length": 1100, "output_length": 4, "hash_ids": [1, 2, 3]},
        {"timestamp": 1500, "input_length": 700, "output_length": 9, "hash_ids": [1, 5]},
    ])
    a, b = load_trace(f, "mooncake")
    assert b.arrival_s == 1.5 and len(a.steps) == 1
    ia, ib = block_prompt(a, a.steps[0]), block_prompt(b, b.steps[0])
    assert len(ia) == 1100 and len(ib) == 700
    assert ia[:512] == ib[:512] and ia[512] != ib[512]


def test_azure_is_seeded_and_unshared(tmp_path: Path) -> None:
    f = tmp_path / "code.csv"
    f.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                 "2023-11-16 18:17:03.9799600,4808,10\n2023-11-16 18:17:05.4799600,300,8")
    a, b = load_azure(f, seed=1)
    assert (b.arrival_s - a.arrival_s) == pytest.approx(1.5)
    assert a.steps[0].prompt_tokens == 4808 and b.steps[0].output_tokens == 8
    assert first_prompt(a)[0] != first_prompt(b)[0]
    assert first_prompt(a) == first_prompt(load_azure(f, seed=1)[0])
    assert first_prompt(a)[0] != first_prompt(load_azure(f, seed=2)[0])[0]


def test_tracelab_session_becomes_program(tmp_path: Path) -> None:
    rounds = [
        {"session_id": "s:1", "round_index": i, "input_tokens_total": 1000 + 300 * i,
         "prefix_tokens": 1000, "newly_append_tokens": 200, "output_tokens": 50,
         "tools": [{"tool_wall_latency_ms": 500}, {"tool_wall_latency_ms": 250}]}
        for i in range(3)
    ]
    (spec,) = load_trace(_jsonl(tmp_path / "t.jsonl", rounds), "tracelab")
    assert len(spec.steps) == 3
    assert spec.steps[0].tool_s == 0.0 and spec.steps[1].tool_s == pytest.approx(0.75)
    assert spec.steps[2].new_tokens == 200


def test_miniswe_sessions_become_programs(tmp_path: Path) -> None:
    f = tmp_path / "m.csv"
    f.write_text(
        "session_id,step,created_unix_s,prompt_tokens,completion_tokens,reasoning_tokens,"
        "cached_tokens,obs_chars_after,obs_returncode,exit_status\n"
        "s1,1,1010,2700,100,0,2000,45,0,Submitted\n"
        "s1,0,1000,2000,200,150,0,1379,0,Submitted\n"
        "s1,2,1014,1500,50,0,1200,10,0,Submitted\n"
        "s2,0,1005,900,10,0,0,5,0,Submitted\n")
    a, b = load_trace(f, "miniswe")
    assert (a.program_id, a.arrival_s, b.program_id, b.arrival_s) == ("swe-s1", 0.0, "swe-s2", 5.0)
    first, second, third = a.steps
    # reasoning tokens are generated too; the first call's prompt is all new
    assert (first.prompt_tokens, first.output_tokens, first.new_tokens) == (2000, 350, 2000)
    # new = 2700 - 2000 - 200 visible; tool time = the stamps' gap
    assert (second.new_tokens, second.tool_s) == (500, 10.0)
    # the history was cut (1500 < 2700 + 100): what the provider had cached stayed
    assert (third.new_tokens, third.tool_s) == (300, 4.0)
    with pytest.raises(TraceError, match=r"m\.csv:2"):
        f.write_text("session_id,step\nx,notanumber\n")
        load_trace(f, "miniswe")
