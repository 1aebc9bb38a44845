"""Harness invariants on small synthetic runs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from daemon.replay.cli import replay_main
from daemon.replay.harness import Replay, ReplayConfig
from daemon.replay.slo import slo_stack
from daemon.replay.synthetic import AgentShape, synthetic_programs
from daemon.replay.workload import ProgramSpec
from scheduling.kv import ProgramStatus, make_kv_policy

SMALL = AgentShape(first_prompt=(7.5, 0.3), appended=(5.5, 0.5), output=(3.5, 0.5),
                   steps_mean=4, shared_prefix_tokens=256)


def _specs(n: int = 12) -> list[ProgramSpec]:
    return synthetic_programs(n, seed=5, shape=SMALL)


def _run(policy: str, kv: int = 12_000, **kw: Any) -> tuple[Replay, dict[str, Any]]:
    cfg = ReplayConfig(kv_tokens=kv, concurrency=8, max_num_seqs=32, **kw)
    replay = Replay(_specs(), cfg, make_kv_policy(policy))
    return replay, replay.run()


def test_every_program_stops_and_tokens_add_up() -> None:
    for policy in ("vllm-default", "thunderagent", "agentd", "continuum-ttl", "sticky"):
        replay, row = _run(policy)
        assert all(p.status is ProgramStatus.STOPPED for p in replay.programs.values())
        expected = sum(s.total_output_tokens for s in _specs())
        assert sum(r.output_tokens for r in replay.records.values()) == expected
        assert row["completed_steps"] == sum(len(s.steps) for s in _specs())
        assert replay.now > 0 and row["elapsed_s"] == round(replay.now, 3)


def test_deterministic_for_a_seed() -> None:
    a, b = _run("agentd")[1], _run("agentd")[1]
    a.pop("wall_s"), b.pop("wall_s")
    assert a == b


def test_unlimited_kv_never_pauses_or_recomputes() -> None:
    roomy = 400_000  # more than every context of the run together
    assert sum(s.steps[-1].prompt_tokens + s.steps[-1].output_tokens for s in _specs()) < roomy
    for policy in ("thunderagent", "agentd"):
        row = _run(policy, kv=roomy, workers=1)[1]
        assert row["paused_share"] == 0.0
        assert row["recomputed_prompt_tokens"] == 0 and row["prefix_hit_rate"] == 1.0


def test_tight_kv_makes_program_aware_policy_pause() -> None:
    row = _run("thunderagent", kv=6_000)[1]
    assert row["paused_share"] > 0


def test_duration_cuts_the_run() -> None:
    replay, row = _run("vllm-default", duration_s=2.0)
    assert row["elapsed_s"] == 2.0
    assert any(p.status is not ProgramStatus.STOPPED for p in replay.programs.values())


def test_requests_unserved_at_the_end_count_as_waiting_until_then() -> None:
    replay, row = _run("agentd", kv=6_000, duration_s=4.0)
    unserved = [r for r in replay.records.values() if r.first_token is None]
    assert unserved and row["unserved_requests"] == len(unserved)
    waits: dict[str, float] = row["wait_s"]
    assert waits["max"] >= max(4.0 - r.arrival for r in unserved) - 1e-3
    assert waits["p50"] <= waits["p99"] <= waits["max"] <= 4.0


def test_slo_stack_runs_and_reports() -> None:
    cfg = ReplayConfig(kv_tokens=12_000, max_num_seqs=16)
    replay = Replay(_specs(), cfg, make_kv_policy("vllm-default"), slo_stack("full"))
    row = replay.run()
    assert row["ordering"] == "full" and row["completed_steps"] == replay.records.__len__()
    assert 0.0 <= float(row["slo_attainment"]) <= 1.0
    assert row["esg"] > 0


def test_the_residency_estimate_is_scored_against_the_sims_cache() -> None:
    # Tight KV pauses programs; every view of a paused one scores the estimate.
    replay, row = _run("agentd", kv=6_000, residency="estimate")
    est = row["residency_estimate"]
    assert row["residency"] == "estimate" and est["paused_views"] > 0
    assert (est["agree"] + est["false_resident"] + est["false_cold"] + est["unknown"]
            == est["paused_views"])
    assert est["agree_share"] == round(est["agree"] / est["paused_views"], 4)
    assert all(p.status is ProgramStatus.STOPPED for p in replay.programs.values())


def test_the_policy_sees_the_truth_the_estimate_or_nothing() -> None:
    seen: dict[str, set[object]] = {}
    for mode in ("engine", "estimate", "unknown", "cold"):
        cfg = ReplayConfig(kv_tokens=6_000, concurrency=8, max_num_seqs=32, residency=mode)
        replay = Replay(_specs(), cfg, make_kv_policy("agentd"))
        view = replay.view

        def spy(view=view, mode=mode):  # type: ignore[no-untyped-def]
            v = view()
            seen.setdefault(mode, set()).update(
                p.kv_resident for p in v.programs if p.status is ProgramStatus.PAUSED)
            return v

        replay.view = spy  # type: ignore[method-assign]
        replay.run()
    assert seen["engine"] <= {True, False} and seen["unknown"] == {None}
    assert seen["cold"] == {False}
    assert seen["estimate"] & {True, False}


def test_an_unknown_residency_mode_is_refused() -> None:
    with pytest.raises(ValueError, match="residency must be one of"):
        Replay(_specs(), ReplayConfig(residency="guess"), make_kv_policy("agentd"))


def test_cli_runs_on_the_estimate(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "r.json"
    assert replay_main(["--synthetic-agents", "6", "--concurrency", "4", "--kv-tokens",
                        "60000", "--duration-s", "30", "--kv-residency", "estimate", "--quiet",
                        "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["params"]["kv_residency"] == "estimate"
    assert data["results"][0]["residency"] == "estimate"
    with pytest.raises(SystemExit) as exit_info:
        replay_main(["--synthetic-agents", "2", "--kv-residency", "guess"])
    assert exit_info.value.code == 2
    assert "--kv-residency" in capsys.readouterr().err
