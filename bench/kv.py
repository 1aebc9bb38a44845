"""KV policy benchmark: a concurrency sweep of closed-loop agent programs on two simulated
llama3-8b-h100 workers, all five KV policies side by side plus the no-thrash bound
(``vllm-default`` with unlimited KV), on synthetic agents and on the Mooncake trace, each
through `agentd replay`: the daemon's own core in virtual time, configured as `agentd
start` is (a variant is a config change: ``kv_policy``, ``kv_options``,
``kv_force_resume_s``), seeing what the daemon sees (its residency estimate).

    python -m bench.kv [--quick]   ->  bench/results/kv.json, bench/results/kv.png

The JSON's ``ablation`` rows rerun ``agentd`` on the synthetic agents at the lowest and
the highest concurrency with each ``AgentdOptions`` flag flipped (on-by-default ones off,
opt-in ones on) and with the other option values in ``VALUES``; at the highest also
ThunderAgent and agentd with a longer force-resume timeout and with none, which shows
what each one's wait bound costs (the flags are the daemon's ``[kv_options]``).
stdout gets a markdown table per workload and one for the ablation; ``wait p99/max`` is
ready-to-first-token, counting requests still unserved at the end as waiting until then.

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
from concurrent.futures import ProcessPoolExecutor
from functools import partial
from itertools import product
from pathlib import Path
from typing import Any

from bench.common import TRACES, Stopwatch, log, save
from bench.plot import plot_kv
from daemon import config as config_mod
from daemon.replay import Hardware, Workload, load_trace, replay, synthetic_programs
from daemon.replay.workload import ProgramSpec
from scheduling.kv import AgentdOptions, KvConfig

POLICIES = ("vllm-default", "sticky", "continuum-ttl", "thunderagent", "agentd")
BOUND = "no-thrash-bound"
CONCURRENCY = (16, 32, 64, 128, 256)
KV_TOKENS = 444_000
UNLIMITED_KV = 1 << 23  # past any run here (8.4M tokens): the no-thrash bound's KV
DURATION_S = 300.0
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


def workloads(max_conc: int, seed: int) -> dict[str, list[ProgramSpec]]:
    mooncake = load_trace(TRACES / "mooncake_fast25_conversation_trace.jsonl", "mooncake")
    return {"synthetic-agents": synthetic_programs(4 * max_conc, seed=seed),
            "mooncake": mooncake[: 40 * max_conc]}


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


Task = tuple[str, int, str, bool]  # workload, concurrency, label, ablation row?
_LOADED: dict[str, list[ProgramSpec]] = {}


def _load(max_conc: int, seed: int) -> None:
    _LOADED.update(workloads(max_conc, seed))


def run_task(task: Task, high: int, duration: float) -> dict[str, Any]:
    """One replay; runs in a worker process that `_load`ed the workloads."""
    workload, conc, label, ablated = task
    kv_tokens, keys = ablation_variants(conc == high)[label] if ablated else main_variant(label)
    config = config_mod.load(flags=keys, env={})
    hardware = Hardware(workers=2, kv_tokens=kv_tokens, cost_model="llama3-8b-h100",
                        max_num_seqs=256, max_batched_tokens=8192)
    row = replay(_LOADED[workload], config, hardware, Workload(conc, duration))
    return {"workload": workload, "concurrency": conc, **row, "policy": label,
            "force_resume_s": config.kv_force_resume_s}


def tasks(concs: tuple[int, ...]) -> tuple[list[Task], list[Task]]:
    main = [(w, c, p, False) for w in ("synthetic-agents", "mooncake")
            for c, p in product(concs, (*POLICIES, BOUND))]
    ablated = [("synthetic-agents", c, label, True) for c in (min(concs), max(concs))
               for label in ablation_variants(c == max(concs))]
    return main, ablated


def run_all(todo: list[Task], concs: tuple[int, ...], duration: float, seed: int,
            jobs: int) -> list[dict[str, Any]]:
    clock = Stopwatch()
    run = partial(run_task, high=max(concs), duration=duration)
    rows = []
    with ProcessPoolExecutor(jobs, initializer=_load, initargs=(max(concs), seed)) as pool:
        for row in pool.map(run, todo):
            rows.append(row)
            log(f"[bench-kv {clock.elapsed():5.0f}s] {row['workload']} c={row['concurrency']} "
                f"{row['policy']}: {row['throughput_steps_per_min']} steps/min, "
                f"hit {row['prefix_hit_rate']}, preemptions {row['preemptions']}")
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--quick", action="store_true", help="two concurrencies, 120 s runs")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--jobs", type=int, default=min(4, os.cpu_count() or 1),
                   help="replays run in parallel (each is single-threaded and deterministic)")
    p.add_argument("--concurrency", help="comma-separated live-program counts (overrides "
                                         "the sweep and --quick's)")
    args = p.parse_args(argv)
    concs: tuple[int, ...] = (16, 256) if args.quick else CONCURRENCY
    if args.concurrency:
        concs = tuple(int(c) for c in args.concurrency.split(","))
    duration = 120.0 if args.quick else DURATION_S
    clock = Stopwatch()
    main_tasks, ablation_tasks = tasks(concs)
    done = run_all(main_tasks + ablation_tasks, concs, duration, args.seed, max(1, args.jobs))
    rows, ablated = done[: len(main_tasks)], done[len(main_tasks):]
    params = {"workers": 2, "kv_tokens_per_worker": KV_TOKENS, "cost_model": "llama3-8b-h100",
              "duration_s": duration, "concurrency": list(concs), "seed": args.seed,
              "force_resume_s": KvConfig().force_resume_s,
              "kv_note": "H100 444k tokens per worker; agent contexts overflow 2 workers past "
                         "~40 live programs, so thrashing occurs without shrinking KV",
              "bound": "vllm-default with unlimited KV (no eviction, no preemption); not an "
                       "upper bound at high concurrency, where attention over every live "
                       "context slows each step",
              "simulated": True, "jobs": args.jobs, "wall_s": round(clock.elapsed(), 1)}
    path = save("kv", params, rows)
    data = json.loads(Path(path).read_text())
    Path(path).write_text(json.dumps({**data, "ablation": ablated}, indent=2) + "\n")
    plot_kv(rows, Path(path).with_suffix(".png"))
    print(tables(rows))
    print(ablation_table(ablated))
    log(targets(rows, concs))
    return 0


def _ratio(rows: list[dict[str, Any]], row: dict[str, Any]) -> float:
    base = next(float(r["throughput_steps_per_min"]) for r in rows
                if r["workload"] == row["workload"] and r["concurrency"] == row["concurrency"]
                and r["policy"] == "vllm-default")
    return float(row["throughput_steps_per_min"]) / max(base, 1e-9)


def tables(rows: list[dict[str, Any]]) -> str:
    """A markdown table per workload: one row per policy and concurrency."""
    out = []
    for w in dict.fromkeys(r["workload"] for r in rows):
        out += [f"\n{w} (simulated, 2 workers x {KV_TOKENS} tokens)\n",
                "| policy | c | steps/min | vs vllm-default | prefix hit | imbalance mean/peak "
                "| paused share | wait p99/max s | unserved |",
                "|---|---|---|---|---|---|---|---|---|"]
        for policy in (*POLICIES, BOUND):
            for r in (r for r in rows if r["workload"] == w and r["policy"] == policy):
                out.append(_line(rows, r))
    return "\n".join(out)


def ablation_table(ablated: list[dict[str, Any]]) -> str:
    out = ["\nablation (synthetic agents)\n",
           "| variant | c | steps/min | prefix hit | preemptions | imbalance mean/peak "
           "| paused share | wait p99/max s |",
           "|---|---|---|---|---|---|---|---|"]
    for r in ablated:
        out.append(f"| {r['policy']} | {r['concurrency']} | {r['throughput_steps_per_min']} | "
                   f"{r['prefix_hit_rate']} | {r['preemptions']} | {_imb(r)} | "
                   f"{r['paused_share']} | {_wait(r)} |")
    return "\n".join(out)


def _imb(r: dict[str, Any]) -> str:
    return f"{r['kv_imbalance']['mean']}/{r['kv_imbalance']['peak']}"


def _wait(r: dict[str, Any]) -> str:
    return f"{r['wait_s']['p99']:.0f}/{r['wait_s']['max']:.0f}"


def _line(rows: list[dict[str, Any]], r: dict[str, Any]) -> str:
    return (f"| {r['policy']} | {r['concurrency']} | {r['throughput_steps_per_min']} | "
            f"{_ratio(rows, r):.2f}x | {r['prefix_hit_rate']} | {_imb(r)} | "
            f"{r['paused_share']} | {_wait(r)} | {r['unserved_requests']} |")


def targets(rows: list[dict[str, Any]], concs: tuple[int, ...]) -> str:
    def row(c: int, p: str) -> dict[str, Any]:
        return next(r for r in rows
                    if r["workload"] == "synthetic-agents" and r["concurrency"] == c
                    and r["policy"] == p)

    hi, lo = _ratio(rows, row(max(concs), "agentd")), _ratio(rows, row(min(concs), "agentd"))
    hits = ", ".join(f"{c}: {row(c, 'agentd')['prefix_hit_rate']}" for c in concs)
    imb = ", ".join(f"{c}: {row(c, 'agentd')['kv_imbalance']['mean']}" for c in concs)

    def tput(c: int, p: str) -> float:
        return float(row(c, p)["throughput_steps_per_min"])

    gap = ", ".join(f"c={c}: {tput(c, 'agentd') / max(tput(c, BOUND), 1e-9):.2f}" for c in concs)
    return (f"agentd/vllm-default throughput: {hi:.2f}x at c={max(concs)} (target >= 2.0), "
            f"{lo:.2f}x at c={min(concs)} (target >= 0.97); agentd prefix hit by c {hits} "
            f"(target >= 0.95); agentd KV imbalance mean by c {imb} (target <= 0.10); "
            f"agentd/no-thrash bound: {gap}")

if __name__ == "__main__":
    raise SystemExit(main())
