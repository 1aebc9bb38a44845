"""The swap benchmark's figures from one run (bench/policy_swap.py): dispatch stalls per
window kind, the event-loop hold of each registry call (the daemon's own `loop_hold`),
the daemon's ticks and garbage collections (bench/daemon_probe/sitecustomize.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from bench.policy_swap_report import (
    STALL_TARGET_MS,
    baseline_stalls,
    longest_gap,
    summary,
    window_stats,
)
from bench.policy_swap_sources import SOURCES

WINDOWS = {"activate": "activate request", "store": "store request",
           "rollback": "rollback request", "control": "control (GET /healthz)"}
CALLS = ("store", "activate", "rollback")  # the registry calls whose loop hold is reported


def stalls(run: dict[str, Any], swaps: list[dict[str, Any]]) -> dict[str, Any]:
    d, base, pauses = run["dispatches"], run["base"], _pauses(run)
    out = {f"stall_during_{kind}": window_stats(d, [s[kind] for s in swaps], base, pauses)
           for kind in WINDOWS}
    act, ctl = out["stall_during_activate"], out["stall_during_control"]
    out["activate_minus_control_ms"] = {
        key: {q: round(act[key][q] - ctl[key][q], 2) for q in ("p50", "p99")}
        for key in ("stall_ms", "stall_ms_no_gc")}
    return out


def loop_hold(swaps: list[dict[str, Any]], call: str) -> dict[str, Any]:
    """The longest stretch (ms) each `call` held the daemon's event loop, as the daemon
    measured it: in wall time, and in wall and CPU time less garbage collection."""
    holds = [s["hold"][call] for s in swaps if s["hold"][call] is not None]
    wall, cpu = ([h[key] for h in holds] for key in ("wall_less_gc_ms", "cpu_less_gc_ms"))
    worst = max(holds, key=lambda h: h["cpu_less_gc_ms"], default=None)
    return {"wall_ms": summary([h["wall_ms"] for h in holds]),
            "wall_less_gc_ms": summary(wall), "cpu_less_gc_ms": summary(cpu),
            "over_10ms_wall_less_gc": sum(v > STALL_TARGET_MS for v in wall),
            "over_10ms_cpu_less_gc": sum(v > STALL_TARGET_MS for v in cpu),
            "steps_per_call": summary([h["steps"] for h in holds], 0),
            # where the CPU-longest of these calls held the loop (the daemon names the two
            # awaits around its longest step)
            "worst_step": None if worst is None else worst.get("cpu_longest_step")}


def tick_summary(run: dict[str, Any]) -> dict[str, Any]:
    """The daemon's scheduling ticks of 1 ms or more, swap phase and baseline together."""
    start, end = run["base"][0], run["swap_phase"][1]
    out: dict[str, Any] = {}
    for kind in sorted({t["tick"] for t in run["ticks"]}):
        mine = [t for t in run["ticks"] if t["tick"] == kind and start <= t["end"] <= end]
        out[kind] = {"over_1ms": len(mine),
                     "wall_less_gc_ms": summary([1000 * (t["wall"] - t["gc_wall"]) for t in mine]),
                     "cpu_ms": summary([1000 * t["cpu"] for t in mine])}
    return out


def _pauses(run: dict[str, Any]) -> list[tuple[float, float]]:
    return [(c["start"], c["end"]) for c in run["collections"]]


def gc_summary(run: dict[str, Any]) -> dict[str, Any]:
    """Collections of 1 ms or more from the baseline's start to the swap phase's end
    (startup's are left out: nothing is dispatched yet)."""
    start, end = run["base"][0], run["swap_phase"][1]
    out: dict[str, Any] = {}
    for c in run["collections"]:
        if not start <= c["end"] <= end:
            continue
        key = f"{'daemon' if c['role'] == 'start' else c['role']} gen{c['generation']}"
        out.setdefault(key, []).append(1000 * (c["end"] - c["start"]))
    return {key: {"count": len(v), "wall_ms": summary(v, 1)} for key, v in sorted(out.items())}


def per_layer(run: dict[str, Any]) -> dict[str, Any]:
    layers: dict[str, Any] = {}
    for layer in SOURCES:
        mine = [s for s in run["swaps"] if s["layer"] == layer]
        confirmed = [s for s in mine if s["not_active"] is None]
        layers[layer] = {
            "swaps": len(mine),
            "not_active_after": [s["not_active"] for s in mine if s["not_active"]],
            "store_ms": summary([s["store_ms"] for s in mine]),
            "activate_ms": summary([s["activate_ms"] for s in confirmed]),
            "activate_answer_ms": summary([s["answer_ms"] for s in mine]),
            "swap_us_in_daemon": summary([s["swap_us"] for s in mine], 1),
            "rollback_ms": summary([s["rollback_ms"] for s in mine if s["rolled_back"]]),
            "not_rolled_back": sum(not s["rolled_back"] for s in mine),
            **{f"loop_hold_{call}": loop_hold(mine, call) for call in CALLS},
            **stalls(run, mine),
        }
    return layers


def curves(run: dict[str, Any]) -> dict[str, list[float]]:
    d, swaps = run["dispatches"], run["swaps"]
    raw = {label: [1000 * longest_gap(d, *s[kind]) for s in swaps]
           for kind, label in WINDOWS.items()}
    lengths = [s["activate"][1] - s["activate"][0] for s in swaps]
    raw["baseline (activate lengths)"] = [1000 * g for g in baseline_stalls(
        d, run["base"], lengths)]
    return raw


def probe_path() -> str:
    """PYTHONPATH for the daemon: the GC probe first, then what the benchmark has."""
    here = Path(__file__).resolve().parent
    rest = [p for p in (str(here.parent), os.environ.get("PYTHONPATH", "")) if p]
    return os.pathsep.join([str(here / "daemon_probe"), *rest])


def read_probe(directory: Path) -> dict[str, list[Any]]:
    """What the daemon probe wrote (see its docstring): collections, ticks, loop lags,
    per-request intake records, store waits and the collector's state at exit."""
    out: dict[str, list[Any]] = {"collections": [], "ticks": [], "lags": [], "intake": [],
                                 "awaits": [], "exit": []}
    for path in sorted(directory.glob("*.jsonl")):
        role = path.stem.split("-")[0]
        for line in path.read_text().splitlines():
            record = json.loads(line)
            if "gc" in record:
                out["collections"].append({
                    "role": role, "start": record["end"] - record["wall"],
                    "end": record["end"], "cpu_s": record["cpu"], "generation": record["gc"]})
            elif "req" in record:
                out["intake"].append(record["req"])
            elif "lag" in record:
                out["lags"].append(record)
            elif "await" in record:
                out["awaits"].append(record)
            elif "exit" in record:
                out["exit"].append(record["exit"])
            else:
                out["ticks"].append(record)
    return out
