"""KV policy benchmark: a concurrency sweep of closed-loop agent programs on two simulated
llama3-8b-h100 workers, all five KV policies side by side plus the no-thrash bound
(``vllm-default`` with unlimited KV), on synthetic agents and on the Mooncake trace.

    python -m bench.kv [--quick]   ->  bench/results/kv.json, bench/results/kv.png

Per-worker KV is the H100's 444k tokens: the synthetic agents' contexts (median 17k
tokens at the first round, growing about 2k a round) already overflow two workers past
about 40 live programs, so no shrinking is needed for thrashing to occur.
"""

from __future__ import annotations

import argparse
from itertools import product
from pathlib import Path
from typing import Any

from bench.common import TRACES, Stopwatch, log, save
from bench.plot import plot_kv
from daemon.replay import UNLIMITED_KV, Replay, ReplayConfig, load_trace, synthetic_programs
from daemon.replay.workload import ProgramSpec
from scheduling.kv import make_kv_policy

POLICIES = ("vllm-default", "sticky", "continuum-ttl", "thunderagent", "agentd")
BOUND = "no-thrash-bound"
CONCURRENCY = (16, 32, 64, 128, 256)
KV_TOKENS = 444_000
DURATION_S = 300.0


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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--quick", action="store_true", help="two concurrencies, 120 s runs")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    concs = (16, 256) if args.quick else CONCURRENCY
    duration = 120.0 if args.quick else DURATION_S
    clock, rows = Stopwatch(), []
    for name, specs in workloads(max(concs), args.seed).items():
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
    path = save("kv", params, rows)
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
