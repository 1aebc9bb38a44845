"""Load imbalance (NALAR §6.1): static routing vs the default policies, on two workflows.

    python -m bench.runtime_imbalance [--quick]  ->  bench/results/runtime_imbalance.json/.png

- router (bench/runtime_router.py): a classifier, then a chat or a coding branch, on the
  Azure 2023 code + conversation traces: the branch mix shifts minute to minute;
- analyst (bench/runtime_analyst.py): the financial-analyst fan-out with sticky
  sessions, on the Mooncake conversation trace's sessions and follow-up turns.

Instances are emulated on a virtual clock with the sim engine's cost model
(bench/runtime_sim.py); everything else is the real control layer, the global
controller running every 0.5 s:
- static: no global decisions (each agent keeps its instances, a session its instance;
  new calls go to the least-loaded instance of their agent);
- nalar: load-balanced routing + head-of-line migration + resource reassignment within
  the same instance budget (a new instance serves PROVISION_S after the one it replaces
  has drained; reassignment asks for a backlog difference longer than that);
- each of the three alone (the ablation).
Bounds, for reading the reductions: the router on one shared pool of the same
instances (instant, free reassignment), and the analyst's turns without any queueing.
For the analyst also a reference for what the recompute costs: nalar with KV that
moves for free (bench/runtime_analyst.py, `free_moves`: no sticky sessions, every cache
hits). nalar pays a session's whole recompute on each move; the gap between the two is
that price, and the gap from the reference to the bound is early binding (a call
queues where it was placed until the next global step moves it).
For the router also a reference for reassignment itself: `Clairvoyant`
(bench/runtime_router.py) knows the requests to come, pays the same model load and
drain, and has floors of one instance per agent (with the bench's min_instances it
gained about half as much at load 1.2 in trial runs); a heuristic, not an optimum,
but no causal policy should be expected to beat it by much. At load 1.2 the chat
branch runs at ~95% of its static share and the whole budget at ~86%: an instance
taken for a coding burst is repaid at the chat branch's 5% slack, so whole-instance
moves gain far less than the shared pool, which shares per call.
Loads 1.3 and 1.4 are overload (load 1 keeps ~72% of the instances busy: 1.3 ~94%,
1.4 ~100%; the router's chat branch alone is past its static share at 1.3): there the
default policies must do no harm. The analyst's `state rebuilt s` column is the
prefill paid again because a move took a session off its cache (nalar's price for
moving; 0 for static).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import runtime_analyst, runtime_router
from bench.common import RESULTS, Stopwatch, log, save
from bench.runtime_sim import PERIOD_S, PROVISION_S, Setup
from daemon.engines.sim.cost import CostModel, load_cost_model
from scheduling.agents.policies import (
    HeadOfLineMigration,
    LoadBalanced,
    ResourceReassignment,
    StaticRouting,
)
from scheduling.agents.policy import Combined, ControlPolicy

COST_MODEL = "llama3-8b-h100"
LOADS = (0.8, 1.0, 1.2, 1.3, 1.4)
WORKFLOWS = ("router", "analyst")
CLAIRVOYANT_SETUP = Setup(runtime_router.ALLOCATION)  # min_instances 1 each
CLAIRVOYANT_LOOK_S = 5.0  # how far past the model load it reads ahead


def policies(budget: int) -> dict[str, Callable[[], ControlPolicy]]:
    def reassign() -> ResourceReassignment:
        return ResourceReassignment(budget=budget, min_gain_s=PROVISION_S)

    return {"static": StaticRouting,
            "nalar": lambda: Combined(LoadBalanced(), HeadOfLineMigration(), reassign(),
                                      name="nalar"),
            "load-balanced": LoadBalanced, "hol-migration": HeadOfLineMigration,
            "reassign": reassign}


def run_load(workflow: str, load: float, names: list[str], window: tuple[float, float],
             cost: CostModel) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    if workflow == "router":
        reqs = runtime_router.requests(load, window)
        arms = policies(runtime_router.ROUTER.budget)
        for name in names:
            rows.append(runtime_router.simulate(arms[name](), name, reqs, cost))
        rows.append(runtime_router.simulate(StaticRouting(), "one shared pool (bound)", reqs,
                                            cost, pooled=True))
        ahead = runtime_router.Clairvoyant(reqs, cost, CLAIRVOYANT_SETUP, CLAIRVOYANT_LOOK_S)
        rows.append(runtime_router.simulate(ahead, "clairvoyant reassign (reference)", reqs,
                                            cost, setup=CLAIRVOYANT_SETUP))
    else:
        turns = runtime_analyst.turns(load, window)
        arms = policies(runtime_analyst.ANALYST_SETUP.budget)
        for name in names:
            rows.append(runtime_analyst.simulate(arms[name](), name, turns, cost))
        rows.append(runtime_analyst.simulate(arms["nalar"](), "nalar, free KV moves (reference)",
                                             turns, cost, free_moves=True))
        rows.append(runtime_analyst.unqueued(turns, cost))
    for r in rows[1:]:
        for key in ("p95_s", "p99_s"):
            r[f"{key[:3]}_reduction"] = 1 - r[key] / rows[0][key]
    return [{"workflow": workflow, "load": load, **r} for r in rows]


def plot(rows: list[dict[str, Any]], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    flows = list(dict.fromkeys(r["workflow"] for r in rows))
    fig, axes = plt.subplots(len(flows), 2, figsize=(11, 4 * len(flows)), squeeze=False)
    for row_axes, flow in zip(axes, flows, strict=True):
        mine = [r for r in rows if r["workflow"] == flow]
        for policy in dict.fromkeys(r["policy"] for r in mine):
            pts = sorted((r for r in mine if r["policy"] == policy), key=lambda r: r["load"])
            style = ":" if "bound" in policy or "reference" in policy else "o-"
            for ax, key in zip(row_axes, ("p95_s", "p99_s"), strict=True):
                ax.plot([r["load"] for r in pts], [r[key] for r in pts], style, label=policy)
                ax.set_title(f"{flow}: {key[:3].upper()} request latency (s)")
                ax.set_xlabel("load (x the trace's rate)")
                ax.set_yscale("log")
                ax.legend(fontsize=7)
    fig.suptitle("load imbalance, emulated instances (sim cost model llama3-8b-h100)")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| workflow | load | policy | requests | mean s | P50 s | P95 s | P99 s "
             "| P95 / P99 reduction | migrations | state rebuilt s | provisioned |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        red = (f"{r['p95_reduction']:.0%} / {r['p99_reduction']:.0%}"
               if "p99_reduction" in r else "")
        rebuilt = f"{r['rebuilt_s']:.0f}" if "rebuilt_s" in r else ""
        lines.append(
            f"| {r['workflow']} | {r['load']:g} | {r['policy']} | {r['requests']} | "
            f"{r['mean_s']:.1f} | {r['p50_s']:.1f} | {r['p95_s']:.1f} | {r['p99_s']:.1f} | "
            f"{red} | {r.get('migrations', '')} | {rebuilt} | "
            f"{r.get('instances_provisioned', '')} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="5 minutes of trace, two loads")
    p.add_argument("--no-ablation", action="store_true", help="static and nalar only")
    p.add_argument("--workflows", default=",".join(WORKFLOWS))
    p.add_argument("--loads", type=lambda v: tuple(float(x) for x in v.split(",")))
    args = p.parse_args(argv)
    names = ["static", "nalar"] + ([] if args.no_ablation or args.quick else
                                   ["load-balanced", "hol-migration", "reassign"])
    loads = args.loads or ((1.0, 1.2) if args.quick else LOADS)
    cost = load_cost_model(COST_MODEL)
    clock = Stopwatch()
    rows: list[dict[str, Any]] = []
    windows = {"router": runtime_router.WINDOW_S, "analyst": runtime_analyst.WINDOW_S}
    for flow in args.workflows.split(","):
        window = windows[flow]
        if args.quick:
            window = (window[0], window[0] + 300.0)
        for load in loads:
            rows += run_load(flow, load, names, window, cost)
            nalar = next(r for r in rows[::-1] if r["policy"] == "nalar")
            log(f"{flow} load {load}: nalar P99 {nalar['p99_s']:.1f} s, "
                f"{nalar['p99_reduction']:.0%} below static ({clock.elapsed():.0f} s)")
    params = {"emulated": True, "simulated_service_times": COST_MODEL,
              "router": {"traces": [runtime_router.CODE.name, runtime_router.CONV.name],
                         "window_s": list(windows["router"]),
                         "allocation": runtime_router.ALLOCATION,
                         "min_instances": runtime_router.MIN_INSTANCES,
                         "min_instances_why": "measured: floors of 1 (or Coding 2) let the "
                         "default policy strip the coding branch between bursts; P99 at "
                         "load 1.2 no better, mostly worse",
                         "clairvoyant": {"min_instances": 1, "look_s": CLAIRVOYANT_LOOK_S}},
              "analyst": {"trace": runtime_analyst.MOONCAKE.name,
                          "window_s": list(windows["analyst"]),
                          "allocation": runtime_analyst.ALLOCATION,
                          "follow_up_blocks": runtime_analyst.FOLLOW_BLOCKS},
              "quick": args.quick, "provision_s": PROVISION_S, "period_s": PERIOD_S,
              "budget": "the setup's instances are all there is: a provisioned instance "
                        "loads only on resources a dead instance freed",
              "loads": list(loads)}
    path = save("runtime_imbalance", params, rows)
    plot(rows, RESULTS / "runtime_imbalance.png")
    print(table(rows))
    log(f"wrote {path} and runtime_imbalance.png in {clock.elapsed():.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
