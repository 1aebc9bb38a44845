"""KV policy benchmark: a concurrency sweep of closed-loop agent programs on two simulated
llama3-8b-h100 workers, all five KV policies side by side plus the no-thrash bound
(``vllm-default`` with unlimited KV), on synthetic agents and on the Mooncake trace.

    python -m bench.kv [--quick]   ->  bench/results/kv.json, bench/results/kv.png

The JSON's ``ablation`` rows rerun ``agentd`` on the synthetic agents at the highest
concurrency with each ``AgentdOptions`` flag flipped (on-by-default ones off, opt-in
ones on), the opt-in ``patient_force_resume`` variant with each default addition off,
and ThunderAgent with force-resume disabled; at the lowest concurrency, agentd with and
without spread admission.

Per-worker KV is the H100's 444k tokens: the synthetic agents' contexts (median 17k
tokens at the first round, growing about 2k a round) already overflow two workers past
about 40 live programs, so no shrinking is needed for thrashing to occur.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from itertools import product
from pathlib import Path
from typing import Any

from bench.common import TRACES, Stopwatch, log, save
from bench.plot import plot_kv
from daemon.replay import UNLIMITED_KV, Replay, ReplayConfig, load_trace, synthetic_programs
from daemon.replay.workload import ProgramSpec
from scheduling.kv import AgentdOptions, AgentdPolicy, KvConfig, KvPolicy, make_kv_policy

POLICIES = ("vllm-default", "sticky", "continuum-ttl", "thunderagent", "agentd")
BOUND = "no-thrash-bound"
CONCURRENCY = (16, 32, 64, 128, 256)
KV_TOKENS = 444_000
DURATION_S = 300.0
# AgentdOptions flags that are on by default; each ablation row turns one of them off.
ON_BY_DEFAULT = ("spread_admission", "predicted_hold", "migration_cost", "smooth_admission")
# Flags off by default; each ablation row turns one of them on.
OFF_BY_DEFAULT = ("fleet_prior", "share_prefix", "patient_force_resume")
PATIENT = AgentdOptions(patient_force_resume=True)
NO_FORCE_RESUME = KvConfig(force_resume_s=float("inf"))


def workloads(max_conc: int, seed: int) -> dict[str, list[ProgramSpec]]:
    mooncake = load_trace(TRACES / "mooncake_fast25_conversation_trace.jsonl", "mooncake")
    return {"synthetic-agents": synthetic_programs(4 * max_conc, seed=seed),
            "mooncake": mooncake[: 40 * max_conc]}


def run_one(specs: list[ProgramSpec], conc: int, policy: str, duration: float) -> dict[str, Any]:
    kv = UNLIMITED_KV if policy == BOUND else KV_TOKENS
    cfg = ReplayConfig(workers=2, kv_tokens=kv, concurrency=conc, duration_s=duration)
    row = Replay(specs, cfg, make_kv_policy("vllm-default" if policy == BOUND else policy)).run()
    row["policy"] = policy
    return row


def ablation_variants(high: bool) -> list[tuple[str, KvPolicy, KvConfig]]:
    """agentd as shipped and with each flag flipped; at high load also the patient
    variant with each of its other additions off, and ThunderAgent without
    force-resume (the mechanism that bounds both at high load). Low load: spread only."""
    base, kv = AgentdOptions(), KvConfig()
    if not high:
        return [("agentd", AgentdPolicy(base), kv),
                ("agentd -spread_admission",
                 AgentdPolicy(replace(base, spread_admission=False)), kv)]
    rows: list[tuple[str, KvPolicy, KvConfig]] = [("agentd", AgentdPolicy(base), kv)]
    rows += [(f"agentd -{f}", AgentdPolicy(replace(base, **{f: False})), kv)
             for f in ON_BY_DEFAULT]
    rows += [(f"agentd +{f}", AgentdPolicy(replace(base, **{f: True})), kv)
             for f in OFF_BY_DEFAULT]
    rows += [(f"agentd +patient -{f}", AgentdPolicy(replace(PATIENT, **{f: False})), kv)
             for f in ON_BY_DEFAULT]
    rows += [("thunderagent (no force-resume)", make_kv_policy("thunderagent"),
              NO_FORCE_RESUME)]
    return rows


def ablation(specs: list[ProgramSpec], concs: tuple[int, ...],
             duration: float) -> list[dict[str, Any]]:
    rows = []
    for conc in concs:
        for label, policy, kv in ablation_variants(conc == max(concs)):
            cfg = ReplayConfig(workers=2, kv_tokens=KV_TOKENS, concurrency=conc,
                               duration_s=duration, kv=kv)
            row = Replay(specs, cfg, policy).run()
            rows.append({"workload": "synthetic-agents", "concurrency": conc, **row,
                         "policy": label})
            log(f"[bench-kv ablation] c={conc} {label}: {row['throughput_steps_per_min']} "
                f"steps/min, hit {row['prefix_hit_rate']}, preemptions {row['preemptions']}")
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--quick", action="store_true", help="two concurrencies, 120 s runs")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    concs = (16, 256) if args.quick else CONCURRENCY
    duration = 120.0 if args.quick else DURATION_S
    clock, rows = Stopwatch(), []
    loaded = workloads(max(concs), args.seed)
    for name, specs in loaded.items():
        for conc, policy in product(concs, (*POLICIES, BOUND)):
            row = run_one(specs, conc, policy, duration)
            rows.append({"workload": name, "concurrency": conc, **row})
            log(f"[bench-kv {clock.elapsed():5.0f}s] {name} c={conc} {policy}: "
                f"{row['throughput_steps_per_min']} steps/min, hit {row['prefix_hit_rate']}")
    params = {"workers": 2, "kv_tokens_per_worker": KV_TOKENS, "cost_model": "llama3-8b-h100",
              "duration_s": duration, "concurrency": list(concs), "seed": args.seed,
              "kv_note": "H100 444k tokens per worker; agent contexts overflow 2 workers past "
                         "~40 live programs, so thrashing occurs without shrinking KV",
              "bound": "vllm-default with unlimited KV (no eviction, no preemption)",
              "simulated": True, "wall_s": round(clock.elapsed(), 1)}
    ablated = ablation(loaded["synthetic-agents"], (min(concs), max(concs)), duration)
    params["wall_s"] = round(clock.elapsed(), 1)
    path = save("kv", params, rows)
    data = json.loads(Path(path).read_text())
    Path(path).write_text(json.dumps({**data, "ablation": ablated}, indent=2) + "\n")
    plot_kv(rows, Path(path).with_suffix(".png"))
    log(targets(rows, concs))
    return 0


def targets(rows: list[dict[str, Any]], concs: tuple[int, ...]) -> str:
    def tput(w: str, c: int, p: str) -> float:
        return next(float(r["throughput_steps_per_min"]) for r in rows
                    if r["workload"] == w and r["concurrency"] == c and r["policy"] == p)

    w = "synthetic-agents"
    hi = tput(w, max(concs), "agentd") / max(tput(w, max(concs), "vllm-default"), 1e-9)
    lo = tput(w, min(concs), "agentd") / max(tput(w, min(concs), "vllm-default"), 1e-9)
    agentd = [r for r in rows if r["policy"] == "agentd" and r["workload"] == w]
    hit = min(float(r["prefix_hit_rate"]) for r in agentd)
    imb = max(float(r["kv_imbalance"]["mean"]) for r in agentd)
    return (f"agentd/vllm-default throughput: {hi:.2f}x at c={max(concs)} (target >= 2.0), "
            f"{lo:.2f}x at c={min(concs)} (target >= 0.97); agentd prefix hit min {hit:.3f} "
            f"(target >= 0.95); agentd KV imbalance mean max {imb:.3f} (target <= 0.10)")


if __name__ == "__main__":
    raise SystemExit(main())
