"""KV policy benchmark: a concurrency sweep of closed-loop agent programs on two simulated
llama3-8b-h100 workers, every KV policy side by side plus the no-thrash bound
(``vllm-default`` with unlimited KV), on synthetic agents, the Mooncake trace and the
mini-swe-agent trace, each through `agentd replay`: the daemon's own core in virtual time,
configured as `agentd start` is (a variant is a config change: ``kv_policy``,
``kv_options``, ``kv_force_resume_s``), seeing what the daemon sees (its residency view).

    python -m bench.kv [--quick]          ->  bench/results/kv.json, kv.png (report)
    python -m bench.kv --tune [--quick]   ->  bench/results/kv-tune.json, kv-tune.png

The protocol (bench/README.md) is enforced here: a report run replays the synthetic agents
of every seed in ``REPORT_SEEDS`` and the report half of each trace; ``--tune`` replays
``TUNING_SEEDS`` and the dev half, adds the ablation, and prints no target verdict. Tables
give each policy's mean and worst over the seeds, and agentd's throughput against
``vllm-default`` and against the best other policy of the same run (same seed, workload
and concurrency), mean and worst over the seeds.

The ablation (``--tune``) reruns ``agentd`` on the synthetic agents at the lowest and the
highest concurrency with each ``AgentdOptions`` flag flipped (on-by-default ones off,
opt-in ones on) and with the other option values in ``VALUES``; at the highest also
ThunderAgent and agentd with a longer force-resume timeout and with none, which shows what
each one's wait bound costs (the flags are the daemon's ``[kv_options]``). ``wait p99/max``
is ready-to-first-token, counting requests still unserved at the end as waiting until then.

Per-worker KV is the H100's 444k tokens: the synthetic agents' contexts (median 17k
tokens at the first round, growing about 2k a round) already overflow two workers past
about 40 live programs, so no shrinking is needed for thrashing to occur.

The bound is not an upper bound on steps/min at high concurrency: with unlimited KV every
live program decodes in one batch, and the cost model charges attention over all their
contexts each step.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from collections.abc import Iterable
from concurrent.futures import ProcessPoolExecutor
from functools import partial
from itertools import product
from pathlib import Path
from typing import Any

from bench.common import (
    QUICK_SEEDS,
    REPORT_SEEDS,
    TRACES,
    TUNING_SEEDS,
    Stopwatch,
    log,
    save,
    trace_half,
)
from bench.plot import plot_kv
from daemon import config as config_mod
from daemon.replay import Hardware, Workload, load_trace, replay, synthetic_programs
from daemon.replay.traces import with_arrival
from daemon.replay.workload import ProgramSpec
from scheduling.kv import AgentdOptions, KvConfig

POLICIES = ("vllm-default", "sticky", "prefix-router", "continuum-ttl", "thunderagent",
            "autellix-plas", "agentd")
OURS, BASE = "agentd", "vllm-default"
BOUND = "no-thrash-bound"
CONCURRENCY = (16, 32, 64, 128, 256)
QUICK_CONCURRENCY = (16, 64)
KV_TOKENS = 444_000
UNLIMITED_KV = 1 << 23  # past any run here (8.4M tokens): the no-thrash bound's KV
DURATION_S = 300.0
QUICK_DURATION_S = 120.0
SYNTHETIC = "synthetic-agents"
# trace workload -> (file, format, programs per unit of the highest concurrency (0: all),
# closed loop?). Mooncake's requests keep their arrival times; the mini-swe-agent sessions
# are agent programs, so, like the synthetic agents, each starts as soon as one of the
# `concurrency` live slots is free (their recorded start times are spread over 1.9 h and
# would leave the slots empty).
TRACE_FILES = {
    "mooncake": ("mooncake_fast25_conversation_trace.jsonl", "mooncake", 20, False),
    "miniswe": ("miniswe_gemini3pro_swebv_steps_dev.csv", "miniswe", 0, True),
}
# The targets (issue 23), checked on report runs only.
TARGET_HIGH_VS_BASE, TARGET_HIGH_VS_BEST, TARGET_LOW = 1.5, 1.2, 0.97
TARGET_HITS, TARGET_IMBALANCE = 0.95, 0.10
# AgentdOptions flags that are on by default; each ablation row turns one of them off.
ON_BY_DEFAULT = ("fair_resume", "release_on_demand", "longest_acting_first", "cached_first",
                 "spread_admission", "migration_cost", "balance_route", "cold_with_new",
                 "home_cached", "headroom")
# Flags off by default; each ablation row turns one of them on.
OFF_BY_DEFAULT = ("overdue_first", "predicted_hold", "share_prefix", "smooth_admission",
                  "new_wait", "lasting_balance")
# Other values of numeric options, one row each (hold_s=5 was the default before
# cold_with_new and home_cached; headroom=0.05 trades throughput at 256 for hits at 64).
VALUES = (("hold_s", 5.0), ("thrash_slack", 0.06), ("headroom", 0.05))
FORCE_RESUME_S = (120.0, float("inf"))


def trace_workloads(max_conc: int, part: str) -> dict[str, list[ProgramSpec]]:
    out = {}
    for name, (file, fmt, per_conc, closed) in TRACE_FILES.items():
        half = trace_half(load_trace(TRACES / file, fmt), part)
        half = half[: per_conc * max_conc] if per_conc else half
        out[name] = [with_arrival(s, 0.0) for s in half] if closed else half
    return out


# KV tokens per worker, and the daemon config keys the variant sets
Variant = tuple[int, dict[str, Any]]


def main_variant(policy: str) -> Variant:
    if policy == BOUND:
        return UNLIMITED_KV, {"kv_policy": "vllm-default"}
    return KV_TOKENS, {"kv_policy": policy}


def flag_variants() -> dict[str, Variant]:
    """agentd as shipped, with each `AgentdOptions` flag flipped, and with `VALUES`."""
    base = AgentdOptions()
    rows: dict[str, Variant] = {"agentd": (KV_TOKENS, {"kv_policy": "agentd"})}
    for f in ON_BY_DEFAULT:
        off: Any = 0.0 if isinstance(getattr(base, f), float) else False
        rows[f"agentd -{f}"] = (KV_TOKENS, {"kv_policy": "agentd", "kv_options": {f: off}})
    for f in OFF_BY_DEFAULT:
        rows[f"agentd +{f}"] = (KV_TOKENS, {"kv_policy": "agentd", "kv_options": {f: True}})
    for f, value in VALUES:
        rows[f"agentd {f}={value:g}"] = (KV_TOKENS, {"kv_policy": "agentd",
                                                     "kv_options": {f: value}})
    return rows


def ablation_variants(high: bool) -> dict[str, Variant]:
    """Every flag flipped at low and at high load; at high load also both program-aware
    policies under a longer force-resume timeout and with none."""
    rows = flag_variants()
    if not high:
        return rows
    for limit, name in product(FORCE_RESUME_S, ("thunderagent", "agentd")):
        rows[f"{name} force_resume_s={limit:g}"] = (
            KV_TOKENS, {"kv_policy": name, "kv_force_resume_s": limit})
    return rows


# workload, seed (None: a trace), concurrency, label, ablation row?
Task = tuple[str, int | None, int, str, bool]
_LOADED: dict[tuple[str, int | None], list[ProgramSpec]] = {}


def _load(max_conc: int, seeds: tuple[int, ...], part: str) -> None:
    for seed in seeds:
        _LOADED[(SYNTHETIC, seed)] = synthetic_programs(4 * max_conc, seed=seed)
    for name, specs in trace_workloads(max_conc, part).items():
        _LOADED[(name, None)] = specs


def run_task(task: Task, high: int, duration: float) -> dict[str, Any]:
    """One replay; runs in a worker process that `_load`ed the workloads."""
    workload, seed, conc, label, ablated = task
    kv_tokens, keys = ablation_variants(conc == high)[label] if ablated else main_variant(label)
    config = config_mod.load(flags=keys, env={})
    hardware = Hardware(workers=2, kv_tokens=kv_tokens, cost_model="llama3-8b-h100",
                        max_num_seqs=256, max_batched_tokens=8192)
    row = replay(_LOADED[(workload, seed)], config, hardware, Workload(conc, duration))
    return {"workload": workload, "seed": seed, "concurrency": conc, **row, "policy": label,
            "force_resume_s": config.kv_force_resume_s}


def tasks(concs: tuple[int, ...], seeds: tuple[int, ...], ablation: bool
          ) -> tuple[list[Task], list[Task]]:
    runs: list[tuple[str, int | None]] = [(SYNTHETIC, s) for s in seeds]
    runs += [(name, None) for name in TRACE_FILES]
    main = [(w, s, c, p, False) for (w, s), c, p in product(runs, concs, (*POLICIES, BOUND))]
    if not ablation:
        return main, []
    ablated: list[Task] = [(SYNTHETIC, s, c, label, True) for s in seeds
                           for c in sorted({min(concs), max(concs)})
                           for label in ablation_variants(c == max(concs))]
    return main, ablated


def run_all(todo: list[Task], concs: tuple[int, ...], duration: float, seeds: tuple[int, ...],
            part: str, jobs: int) -> list[dict[str, Any]]:
    clock = Stopwatch()
    run = partial(run_task, high=max(concs), duration=duration)
    rows = []
    with ProcessPoolExecutor(jobs, initializer=_load, initargs=(max(concs), seeds, part)) as pool:
        for n, row in enumerate(pool.map(run, todo), 1):
            rows.append(row)
            seed = "" if row["seed"] is None else f" seed {row['seed']}"
            log(f"[bench-kv {clock.elapsed():5.0f}s {n}/{len(todo)}] {row['workload']}{seed} "
                f"c={row['concurrency']} {row['policy']}: {row['throughput_steps_per_min']} "
                f"steps/min, hit {row['prefix_hit_rate']}, refused {row['refused']}")
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tune", action="store_true",
                   help="tuning run: the tuning seeds and the traces' dev halves, with the "
                        "ablation; prints no target verdict")
    p.add_argument("--quick", action="store_true",
                   help=f"smoke test: {QUICK_SEEDS} seeds, concurrency "
                        f"{','.join(map(str, QUICK_CONCURRENCY))}, {QUICK_DURATION_S:g} s runs")
    p.add_argument("--jobs", type=int, default=min(4, os.cpu_count() or 1),
                   help="replays run in parallel (each is single-threaded and deterministic)")
    p.add_argument("--concurrency", help="comma-separated live-program counts (overrides "
                                         "the sweep and --quick's)")
    args = p.parse_args(argv)
    split = TUNING_SEEDS if args.tune else REPORT_SEEDS
    seeds = tuple(split)[:QUICK_SEEDS] if args.quick else tuple(split)
    part = "dev" if args.tune else "report"
    concs: tuple[int, ...] = QUICK_CONCURRENCY if args.quick else CONCURRENCY
    if args.concurrency:
        concs = tuple(int(c) for c in args.concurrency.split(","))
    duration = QUICK_DURATION_S if args.quick else DURATION_S
    clock = Stopwatch()
    main_tasks, ablation_tasks = tasks(concs, seeds, ablation=args.tune)
    done = run_all(main_tasks + ablation_tasks, concs, duration, seeds, part,
                   max(1, args.jobs))
    rows, ablated = done[: len(main_tasks)], done[len(main_tasks):]
    params = {"split": "tune" if args.tune else "report", "seeds": list(seeds),
              "trace_half": part, "workers": 2, "kv_tokens_per_worker": KV_TOKENS,
              "cost_model": "llama3-8b-h100", "duration_s": duration,
              "concurrency": list(concs), "force_resume_s": KvConfig().force_resume_s,
              "kv_note": "H100 444k tokens per worker; agent contexts overflow 2 workers past "
                         "~40 live programs, so thrashing occurs without shrinking KV",
              "bound": "vllm-default with unlimited KV (no eviction, no preemption); not an "
                       "upper bound at high concurrency, where attention over every live "
                       "context slows each step",
              "simulated": True, "jobs": args.jobs, "wall_s": round(clock.elapsed(), 1)}
    path = save("kv-tune" if args.tune else "kv", params, rows)
    if ablated:
        data = json.loads(Path(path).read_text())
        Path(path).write_text(json.dumps({**data, "ablation": ablated}, indent=2) + "\n")
    plot_kv(mean_rows(rows), Path(path).with_suffix(".png"))
    out, verdicts = report(rows, ablated, concs, tune=args.tune)
    print(out)
    if verdicts:
        log(verdicts)
    return 0


def report(rows: list[dict[str, Any]], ablated: list[dict[str, Any]], concs: tuple[int, ...],
           tune: bool) -> tuple[str, str]:
    """The tables, and the target verdicts: none for a tuning run, whose numbers are the
    ones the options were chosen on."""
    out = [tables(rows), ratio_tables(rows)]
    if ablated:
        out.append(ablation_table(ablated))
    return "\n".join(out), "" if tune else targets(rows, concs)


# --- aggregation over seeds ------------------------------------------------------------

def _of(rows: Iterable[dict[str, Any]], workload: str, conc: int, policy: str
        ) -> list[dict[str, Any]]:
    return [r for r in rows if r["workload"] == workload and r["concurrency"] == conc
            and r["policy"] == policy]


def _tput(row: dict[str, Any]) -> float:
    return float(row["throughput_steps_per_min"])


def mean_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per workload, policy and concurrency: the seeds' mean of the plotted metrics."""
    keys = dict.fromkeys((r["workload"], r["concurrency"], r["policy"]) for r in rows)
    out = []
    for w, c, p in keys:
        mine = _of(rows, w, c, p)
        out.append({"workload": w, "concurrency": c, "policy": p,
                    "throughput_steps_per_min": statistics.fmean(map(_tput, mine)),
                    "prefix_hit_rate": statistics.fmean(r["prefix_hit_rate"] for r in mine)})
    return out


def ratios(rows: list[dict[str, Any]], workload: str, conc: int
           ) -> dict[str, list[tuple[float, str]]]:
    """Per seed (or the one trace run): agentd's throughput over vllm-default's, and over the
    best other policy's of the same run (with that policy's name)."""
    out: dict[str, list[tuple[float, str]]] = {"base": [], "best": []}
    for ours in _of(rows, workload, conc, OURS):
        same = [r for r in rows if r["workload"] == workload and r["concurrency"] == conc
                and r["seed"] == ours["seed"] and r["policy"] in POLICIES]
        base = next(r for r in same if r["policy"] == BASE)
        best = max((r for r in same if r["policy"] != OURS), key=_tput)
        out["base"].append((_tput(ours) / max(_tput(base), 1e-9), BASE))
        out["best"].append((_tput(ours) / max(_tput(best), 1e-9), best["policy"]))
    return out


def _mean_worst(values: list[float], worst: str = "min") -> str:
    if len(values) == 1:
        return f"{values[0]:.3g}"
    pick = min(values) if worst == "min" else max(values)
    return f"{statistics.fmean(values):.3g} ({pick:.3g})"


def tables(rows: list[dict[str, Any]]) -> str:
    """A markdown table per workload: one row per policy and concurrency, the mean over the
    seeds and, in brackets, the worst seed."""
    out = []
    for w in dict.fromkeys(r["workload"] for r in rows):
        seeds = sorted({r["seed"] for r in rows if r["workload"] == w and r["seed"] is not None})
        over = f"seeds {seeds[0]}-{seeds[-1]}: mean (worst)" if seeds else "one trace run"
        out += [f"\n{w} (simulated, 2 workers x {KV_TOKENS} tokens; {over})\n",
                "| policy | c | steps/min | prefix hit | imbalance mean | paused share "
                "| wait p99 s | unserved | refused |",
                "|---|---|---|---|---|---|---|---|---|"]
        concs = sorted({r["concurrency"] for r in rows if r["workload"] == w})
        for policy, c in product((*POLICIES, BOUND), concs):
            mine = _of(rows, w, c, policy)
            if not mine:
                continue
            out.append(
                f"| {policy} | {c} | {_mean_worst([_tput(r) for r in mine])} | "
                f"{_mean_worst([r['prefix_hit_rate'] for r in mine])} | "
                f"{_mean_worst([r['kv_imbalance']['mean'] for r in mine], 'max')} | "
                f"{_mean_worst([r['paused_share'] for r in mine], 'max')} | "
                f"{_mean_worst([r['wait_s']['p99'] for r in mine], 'max')} | "
                f"{sum(r['unserved_requests'] for r in mine)} | "
                f"{sum(r['refused'] for r in mine)} |")
    return "\n".join(out)


def ratio_tables(rows: list[dict[str, Any]]) -> str:
    """agentd's throughput ratio against vllm-default and against the best other policy of
    the same run: mean over the seeds (worst seed)."""
    out = ["\nagentd throughput ratios: mean (worst) over the seeds\n",
           "| workload | c | vs vllm-default | vs best other | best other (by seed) |",
           "|---|---|---|---|---|"]
    for w in dict.fromkeys(r["workload"] for r in rows):
        for c in sorted({r["concurrency"] for r in rows if r["workload"] == w}):
            if not _of(rows, w, c, OURS) or not _of(rows, w, c, BASE):
                continue
            r = ratios(rows, w, c)
            names = ", ".join(dict.fromkeys(name for _, name in r["best"]))
            out.append(f"| {w} | {c} | {_mean_worst([v for v, _ in r['base']])} | "
                       f"{_mean_worst([v for v, _ in r['best']])} | {names} |")
    return "\n".join(out)


def ablation_table(ablated: list[dict[str, Any]]) -> str:
    out = ["\nablation (synthetic agents; mean (worst) over the tuning seeds)\n",
           "| variant | c | steps/min | prefix hit | preemptions | imbalance mean "
           "| paused share | wait p99 s |",
           "|---|---|---|---|---|---|---|---|"]
    keys = dict.fromkeys((r["policy"], r["concurrency"]) for r in ablated)
    for label, c in keys:
        mine = _of(ablated, SYNTHETIC, c, label)
        out.append(f"| {label} | {c} | {_mean_worst([_tput(r) for r in mine])} | "
                   f"{_mean_worst([r['prefix_hit_rate'] for r in mine])} | "
                   f"{_mean_worst([r['preemptions'] for r in mine], 'max')} | "
                   f"{_mean_worst([r['kv_imbalance']['mean'] for r in mine], 'max')} | "
                   f"{_mean_worst([r['paused_share'] for r in mine], 'max')} | "
                   f"{_mean_worst([r['wait_s']['p99'] for r in mine], 'max')} |")
    return "\n".join(out)


def _verdict(name: str, mean: float, worst: float, target: float, at_least: bool) -> str:
    met = (worst >= target) if at_least else (worst <= target)
    sign = ">=" if at_least else "<="
    gap = "" if met else f", missed by {abs(worst - target):.3g} on the worst"
    return (f"  {name}: mean {mean:.3g}, worst {worst:.3g} (target {sign} {target:g}): "
            f"{'met' if met else 'MISSED'}{gap}")


def targets(rows: list[dict[str, Any]], concs: tuple[int, ...]) -> str:
    """The issue's targets per workload, on the report seeds and trace halves only; a target
    is met when the worst seed meets it."""
    hi, lo = max(concs), min(concs)
    out = ["target verdicts (report seeds and report halves of the traces):"]
    for w in dict.fromkeys(r["workload"] for r in rows):
        if not _of(rows, w, hi, OURS):
            continue
        out.append(f" {w}:")
        checks = [(f"agentd/vllm-default at c={hi}", [v for v, _ in ratios(rows, w, hi)["base"]],
                   TARGET_HIGH_VS_BASE, True),
                  (f"agentd/best other at c={hi}", [v for v, _ in ratios(rows, w, hi)["best"]],
                   TARGET_HIGH_VS_BEST, True),
                  (f"agentd/best other at c={lo}", [v for v, _ in ratios(rows, w, lo)["best"]],
                   TARGET_LOW, True)]
        for c in sorted({r["concurrency"] for r in rows if r["workload"] == w}):
            mine = _of(rows, w, c, OURS)
            checks.append((f"agentd prefix hit at c={c}",
                           [r["prefix_hit_rate"] for r in mine], TARGET_HITS, True))
            checks.append((f"agentd KV imbalance mean at c={c}",
                           [r["kv_imbalance"]["mean"] for r in mine], TARGET_IMBALANCE, False))
        for name, values, target, at_least in checks:
            worst = min(values) if at_least else max(values)
            out.append(_verdict(name, statistics.fmean(values), worst, target, at_least))
    return "\n".join(out)


if __name__ == "__main__":
    raise SystemExit(main())
