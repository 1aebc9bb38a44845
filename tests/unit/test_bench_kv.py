"""bench.kv's protocol: which seeds and trace halves a run uses, and how it reports them."""

from __future__ import annotations

from typing import Any

from bench import kv
from bench.common import QUICK_SEEDS, REPORT_SEEDS, TUNING_SEEDS, trace_half
from daemon.replay.workload import ProgramSpec, StepSpec


def test_tuning_and_report_seeds_are_apart() -> None:
    assert not set(TUNING_SEEDS) & set(REPORT_SEEDS)
    assert list(TUNING_SEEDS) == list(range(10)) and list(REPORT_SEEDS) == list(range(100, 110))
    assert 0 < QUICK_SEEDS <= len(REPORT_SEEDS)


def test_trace_halves_split_the_programs_and_both_start_at_zero() -> None:
    step = (StepSpec(10, 1, 10),)
    specs = [ProgramSpec(f"p{i}", 100.0 + i, step) for i in range(7)]
    dev, rep = trace_half(specs, "dev"), trace_half(specs, "report")
    assert {s.program_id for s in dev} | {s.program_id for s in rep} == {f"p{i}" for i in range(7)}
    assert not {s.program_id for s in dev} & {s.program_id for s in rep}
    assert dev[0].arrival_s == 0.0 and rep[0].arrival_s == 0.0


def test_tasks_replay_the_given_seeds_and_the_ablation_only_when_asked() -> None:
    main, ablated = kv.tasks((16, 64), (100, 101), ablation=False)
    assert {t[1] for t in main if t[0] == kv.SYNTHETIC} == {100, 101}
    assert {t[0] for t in main if t[1] is None} == set(kv.TRACE_FILES)
    assert {t[3] for t in main} == {*kv.POLICIES, kv.BOUND} and ablated == []
    _, ablated = kv.tasks((16, 64), (0,), ablation=True)
    assert ablated and {t[1] for t in ablated} == {0}
    _, one = kv.tasks((16,), (0,), ablation=True)
    assert len(one) == len(set(one)) == len(kv.ablation_variants(True))


def _row(policy: str, seed: int | None, tput: float, workload: str = kv.SYNTHETIC,
         conc: int = 16) -> dict[str, Any]:
    return {"workload": workload, "seed": seed, "concurrency": conc, "policy": policy,
            "throughput_steps_per_min": tput, "prefix_hit_rate": 0.96,
            "kv_imbalance": {"mean": 0.05, "peak": 0.1}, "paused_share": 0.0,
            "wait_s": {"p99": 1.0, "max": 2.0}, "unserved_requests": 0, "refused": 0}


def _run(seed: int, ours: float, base: float, best: float, conc: int = 16
         ) -> list[dict[str, Any]]:
    rest = [_row(p, seed, 1.0, conc=conc) for p in kv.POLICIES
            if p not in (kv.OURS, kv.BASE, "continuum-ttl")]
    return [_row(kv.OURS, seed, ours, conc=conc), _row(kv.BASE, seed, base, conc=conc),
            _row("continuum-ttl", seed, best, conc=conc), *rest,
            _row(kv.BOUND, seed, 1000.0, conc=conc)]


def test_ratios_are_per_seed_against_vllm_default_and_the_best_other_policy() -> None:
    rows = _run(100, ours=120.0, base=60.0, best=100.0) + _run(101, ours=90.0, base=90.0,
                                                               best=100.0)
    r = kv.ratios(rows, kv.SYNTHETIC, 16)
    assert r["base"] == [(2.0, kv.BASE), (1.0, kv.BASE)]
    # the bound (unlimited KV) is not a policy of the run
    assert r["best"] == [(1.2, "continuum-ttl"), (0.9, "continuum-ttl")]
    table = kv.ratio_tables(rows)
    assert "| synthetic-agents | 16 | 1.5 (1) | 1.05 (0.9) | continuum-ttl |" in table


def test_report_runs_print_verdicts_on_the_worst_seed_and_tuning_runs_none() -> None:
    rows = [*_run(100, 120.0, 60.0, 100.0, conc=16), *_run(101, 90.0, 90.0, 100.0, conc=16),
            *_run(100, 200.0, 100.0, 150.0, conc=64), *_run(101, 170.0, 100.0, 150.0, conc=64)]
    out, verdicts = kv.report(rows, [], (16, 64), tune=False)
    assert "| agentd | 16 | 105 (90) |" in out
    assert "agentd/vllm-default at c=64: mean 1.85, worst 1.7 (target >= 1.5): met" in verdicts
    assert "agentd/best other at c=64: mean 1.23, worst 1.13 (target >= 1.2): MISSED" in verdicts
    out_tune, none = kv.report(rows, [], (16, 64), tune=True)
    assert out_tune == out and none == ""
