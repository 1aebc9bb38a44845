"""SLO stack benchmark: Azure code and conversation traces at rising load on one simulated
llama3-8b-h100 worker, plus three slices (a burst, a medium drift, a slow shift), with
FCFS, each fixed pool policy, meta-rules, meta-bandit, the full stack and its ablations.

    python -m bench.slo [--quick]   ->  bench/results/slo.json, bench/results/slo.png

Each scenario replays a WINDOW_S-second window of trace time compressed by the load
factor; the slices: burst = the code trace's busiest window, drift = the conversation
trace with its load ramping from 1x to 3x of the base, shift = code then conversation.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from bench.common import TRACES, Stopwatch, log, save
from bench.plot import plot_slo
from daemon.replay import Replay, ReplayConfig, slo_stack
from daemon.replay.traces import load_azure, with_arrival
from daemon.replay.workload import ProgramSpec
from scheduling.kv import make_kv_policy

FIXED = ("fcfs", "sjf", "edf", "llf", "two_lane", "wfq", "mlfq")
STACKS = (*FIXED, "meta-rules", "meta-bandit", "full", "full-no-two-lane",
          "full-frozen-statera", "full-no-meta", "full-rule-prediction")
LOADS = (4.0, 16.0, 48.0)
WINDOW_S = 120.0


def window(specs: list[ProgramSpec], start: float, length: float, load: float) -> list[ProgramSpec]:
    picked = [s for s in specs if start <= s.arrival_s < start + length * load]
    return [with_arrival(s, (s.arrival_s - start) / load) for s in picked]


def scenarios(quick: bool) -> dict[str, list[ProgramSpec]]:
    code = load_azure(TRACES / "azure2023_AzureLLMInferenceTrace_code.csv", 0, "code_generation")
    conv = load_azure(TRACES / "azure2023_AzureLLMInferenceTrace_conv.csv", 0, "dialogue")
    loads = LOADS[-1:] if quick else LOADS
    out = {f"{n}-x{load:g}": window(t, 0.0, WINDOW_S, load)
           for n, t in (("code", code), ("conv", conv)) for load in loads}
    base = loads[-1] / 2
    out["slice-burst"] = window(code, _busiest(code), WINDOW_S, base)
    ramp = window(conv, 600.0, WINDOW_S, base * 2)
    out["slice-drift"] = [with_arrival(s, s.arrival_s * (1 - s.arrival_s / (3 * WINDOW_S)))
                          for s in ramp]
    half = WINDOW_S / 2
    out["slice-shift"] = (window(code, 1200.0, half, base)
                          + [with_arrival(s, s.arrival_s + half)
                             for s in window(conv, 1200.0, half, base)])
    return out


def _busiest(specs: list[ProgramSpec]) -> float:
    starts = [s.arrival_s for s in specs]
    best, j = (0, 0.0), 0
    for i, t in enumerate(starts):
        while starts[j] < t - WINDOW_S:
            j += 1
        best = max(best, (i - j, starts[j]))
    return best[1]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--quick", action="store_true", help="highest load and slices only")
    args = p.parse_args(argv)
    clock, rows = Stopwatch(), []
    cfg = ReplayConfig(workers=1, kv_tokens=444_000)
    for name, specs in scenarios(args.quick).items():
        for stack in STACKS:
            row = Replay(specs, cfg, make_kv_policy("vllm-default"), slo_stack(stack)).run()
            rows.append({"scenario": name, "requests": len(specs), **row})
        log(f"[bench-slo {clock.elapsed():5.0f}s] {name}: {len(specs)} requests")
    params = {"workers": 1, "kv_tokens": 444_000, "cost_model": "llama3-8b-h100",
              "window_s": WINDOW_S, "loads": list(LOADS), "kv_policy": "vllm-default",
              "simulated": True, "wall_s": round(clock.elapsed(), 1)}
    path = save("slo", params, rows)
    plot_slo(rows, Path(path).with_suffix(".png"))
    log(targets(rows))
    return 0


def targets(rows: list[dict[str, Any]]) -> str:
    lines = []
    for scenario in dict.fromkeys(r["scenario"] for r in rows):
        by = {r["ordering"]: r for r in rows if r["scenario"] == scenario}
        full, fcfs = by["full"], by["fcfs"]
        best = max(FIXED, key=lambda n: by[n]["esg"])
        lines.append(
            f"{scenario}: full/fcfs ESG {full['esg'] / max(fcfs['esg'], 1e-9):.2f}x, goodput "
            f"{full['goodput_rps'] / max(fcfs['goodput_rps'], 1e-9):.2f}x; full vs best fixed "
            f"({best}) ESG {full['esg'] / max(by[best]['esg'], 1e-9):.2f}x")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
