"""Load imbalance (NALAR §6.1, router workflow): static routing vs the default policies.

    python -m bench.runtime_imbalance [--quick]  ->  bench/results/runtime_imbalance.json/.png

The router workflow: a classifier call, then the chat branch (one call) or the coding
branch (plan, then code; the second depends on the first). Requests replay the Azure
LLM inference traces of 2023-11-16 (CC-BY-4.0): the conversation trace is the chat
branch and the code trace the coding branch, on one clock, so the branch mix shifts the
way the traces do (the code service goes from 0 to hundreds of requests a minute and
back). `--load` compresses time: 2 means twice the trace's rate.

Instances are emulated on a virtual clock: each runs one call at a time, for as long as
the simulated engine's cost model (llama3-8b-h100, batch of one: prefill, then one decode
step per output token) says. Everything else is the real control layer: local
controllers, placement, the global controller every 0.5 s with
- static: no global decisions (each branch keeps its instances; placement is still the
  local least-loaded rule), and
- nalar: load-balanced routing + head-of-line migration + resource reassignment within
  the same instance budget (an instance is taken from an idle agent and given to a
  backlogged one; a new instance serves after PROVISION_S, as a model load would take).
Latency is a request's arrival to its last call's end.
"""

from __future__ import annotations

import argparse
import heapq
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from bench.common import RESULTS, TRACES, Stopwatch, log, save
from daemon.engines.sim.cost import CostModel, load_cost_model, prefill_pairs
from daemon.replay.traces import load_azure
from scheduling.control import Combined, ControlPolicy, Directives, GlobalController
from scheduling.control_cluster import Cluster
from scheduling.control_policies import (
    HeadOfLineMigration,
    LoadBalanced,
    ResourceReassignment,
    StaticRouting,
)

CODE = TRACES / "azure2023_AzureLLMInferenceTrace_code.csv"
CONV = TRACES / "azure2023_AzureLLMInferenceTrace_conv.csv"
COST_MODEL = "llama3-8b-h100"
# In the window the branches keep about 0.4 / 7.9 / 1.8 instances busy on average
# (Classifier / Chat / Coding): 14 instances, split in proportion, is ~72% utilisation
# at load 1; the coding branch's minute-to-minute demand swings between 0 and ~4.
ALLOCATION = {"Classifier": 1, "Chat": 10, "Coding": 3}
# The operator's min_instances: the bursty coding branch never drops below its static
# share (a cold start takes PROVISION_S, longer than a burst takes to build a queue);
# the steady chat branch keeps what its mean demand needs. The rest is the pool that
# reassignment moves. (With every min at 1 reassignment drains coding between bursts
# and its P99 gets worse than static: see the ablation in the JSON and the README.)
MIN_INSTANCES = {"Classifier": 1, "Chat": 8, "Coding": 3}
BUDGET = sum(ALLOCATION.values())
PROVISION_S = 5.0
PERIOD_S = 0.5
WINDOW_S = (1200.0, 2400.0)  # minutes 20-40: code bursts over steady conversation
LOADS = (0.8, 1.0, 1.2)
CLASSIFY_PROMPT, CLASSIFY_OUT, PLAN_OUT = 256, 4, 32


@dataclass(frozen=True)
class Req:
    rid: int
    arrival: float
    branch: str  # Chat | Coding
    prompt: int
    output: int


def requests(load: float, window: tuple[float, float]) -> list[Req]:
    """Both traces on the conversation trace's clock, cut to `window`, time / load."""
    def start(path: Path) -> datetime:
        with path.open() as fh:
            fh.readline()
            return datetime.fromisoformat(fh.readline().split(",")[0].strip()[:26])

    shift = (start(CODE) - start(CONV)).total_seconds()
    rows = [(s.arrival_s + shift, "Coding", s) for s in load_azure(CODE)]
    rows += [(s.arrival_s, "Chat", s) for s in load_azure(CONV)]
    rows = sorted(r for r in rows if window[0] <= r[0] < window[1])
    return [Req(i, (t - window[0]) / load, branch, s.steps[0].prompt_tokens,
                s.steps[0].output_tokens) for i, (t, branch, s) in enumerate(rows)]


def service_s(cost: CostModel, prompt: int, output: int) -> float:
    """Batch of one: the prompt's prefill step, then one decode step per output token."""
    t = cost.step_time(prompt, 0, 0, prefill_pairs(prompt, 0))
    return t + sum(cost.step_time(0, 1, prompt + k) for k in range(output))


POLICIES: dict[str, Callable[[], ControlPolicy]] = {
    "static": StaticRouting,
    "nalar": lambda: Combined(LoadBalanced(), HeadOfLineMigration(),
                              ResourceReassignment(budget=BUDGET), name="nalar"),
    # the ablation: each of the three alone
    "load-balanced": LoadBalanced,
    "hol-migration": HeadOfLineMigration,
    "reassign": lambda: ResourceReassignment(budget=BUDGET),
}


@dataclass
class Sim:
    policy: str
    cost: CostModel
    now: float = 0.0
    events: list[tuple[float, int, str, Any]] = field(default_factory=list)
    seq: int = 0
    latency: dict[int, float] = field(default_factory=dict)
    branch_of: dict[int, str] = field(default_factory=dict)
    work: dict[str, tuple[int, str, float]] = field(default_factory=dict)
    left: dict[int, int] = field(default_factory=dict)
    classifying: dict[int, Req] = field(default_factory=dict)  # waiting for their branch
    arrivals: dict[int, float] = field(default_factory=dict)
    moves: int = 0
    reassigned: int = 0

    def __post_init__(self) -> None:
        agents = {a: Directives(min_instances=MIN_INSTANCES[a], max_instances=BUDGET - 2)
                  for a in ALLOCATION}
        self.c = Cluster(agents, cold_start=True)
        for agent, n in ALLOCATION.items():
            for _ in range(n):
                self.c.add_instance(agent, now=0.0)
        self.gc = GlobalController(POLICIES[self.policy](), PERIOD_S)

    def at(self, t: float, kind: str, data: Any) -> None:
        self.seq += 1
        heapq.heappush(self.events, (t, self.seq, kind, data))

    def run(self, reqs: list[Req]) -> None:
        for r in reqs:
            self.arrivals[r.rid] = r.arrival
            self.at(r.arrival, "arrive", r)
        self.at(PERIOD_S, "tick", None)
        self.c.take_events()  # the initial allocation is not a reassignment
        handlers: dict[str, Callable[[Any], None]] = {
            "arrive": self._arrive, "done": self._done, "tick": self._tick,
            "ready": self._ready}
        while self.events and len(self.latency) < len(reqs):
            self.now, _, kind, data = heapq.heappop(self.events)
            handlers[kind](data)
            self._dispatch()

    def _call(self, fid: str, r: Req, agent: str, prompt: int, out: int,
              deps: tuple[str, ...] = ()) -> None:
        self.work[fid] = (r.rid, agent, service_s(self.cost, prompt, out))
        self.c.create(fid, f"s{r.rid}", agent, self.now, deps=deps)

    def _arrive(self, r: Req) -> None:
        self.branch_of[r.rid] = r.branch
        self.left[r.rid] = 1
        self.classifying[r.rid] = r
        self._call(f"{r.rid}.cls", r, "Classifier", min(r.prompt, CLASSIFY_PROMPT), CLASSIFY_OUT)

    def _done(self, data: tuple[str, str]) -> None:
        inst, fid = data
        rid, agent, _ = self.work.pop(fid)
        self.c.finish(inst, fid, None, True, self.now)
        if agent == "Classifier":
            r = self.classifying.pop(rid)
            if r.branch == "Chat":
                self._call(f"{rid}.chat", r, "Chat", r.prompt, r.output)
            else:
                self.left[rid] = 2
                self._call(f"{rid}.plan", r, "Coding", r.prompt, PLAN_OUT)
                self._call(f"{rid}.code", r, "Coding", r.prompt + PLAN_OUT, r.output,
                           deps=(f"{rid}.plan",))
            return
        self.left[rid] -= 1
        if not self.left[rid]:
            self.latency[rid] = self.now - self.arrivals[rid]
            self.c.forget_session(f"s{rid}")

    def _tick(self, _: Any) -> None:
        step = self.gc.step(self.c.view(self.now), self.now)
        self.c.apply(step.accepted, self.now)
        for e in self.c.take_events():
            if e["event"] == "future.migrated":
                self.moves += 1
            elif e["event"] == "instance.provisioned":
                self.reassigned += 1
                self.at(self.now + PROVISION_S, "ready", e["instance"])
        self.at(self.now + PERIOD_S, "tick", None)

    def _ready(self, instance_id: str) -> None:
        self.c.activate(instance_id)

    def _dispatch(self) -> None:
        for inst in self.c.startable():
            started = self.c.start_next(inst, self.now)
            if started is not None:
                fid = started.future.future_id
                self.at(self.now + self.work[fid][2], "done", (inst, fid))


def simulate(policy: str, reqs: list[Req], cost: CostModel) -> dict[str, Any]:
    sim = Sim(policy, cost)
    sim.run(reqs)
    lat = sorted(sim.latency.values())

    def pct(xs: list[float], q: float) -> float:
        return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")

    by_branch = {b: sorted(v for k, v in sim.latency.items() if sim.branch_of[k] == b)
                 for b in ("Chat", "Coding")}
    return {"policy": policy, "requests": len(lat), "mean_s": statistics.fmean(lat),
            "p50_s": pct(lat, 0.5), "p95_s": pct(lat, 0.95), "p99_s": pct(lat, 0.99),
            **{f"{b.lower()}_p99_s": pct(v, 0.99) for b, v in by_branch.items()},
            "migrations": sim.moves, "instances_provisioned": sim.reassigned,
            "duration_s": sim.now}


def plot(rows: list[dict[str, Any]], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for policy in dict.fromkeys(r["policy"] for r in rows):
        mine = sorted((r for r in rows if r["policy"] == policy), key=lambda r: r["load"])
        for ax, key in zip(axes, ("p95_s", "p99_s"), strict=True):
            ax.plot([r["load"] for r in mine], [r[key] for r in mine], "o-", label=policy)
            ax.set_title(f"{key[:3].upper()} request latency (s)")
            ax.set_xlabel("load (x the Azure traces' rate)")
            ax.set_yscale("log")
            ax.legend()
    fig.suptitle("router workflow, Azure code+conv mix, emulated instances (sim cost model)")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="5 minutes of trace, two loads")
    p.add_argument("--no-ablation", action="store_true", help="static and nalar only")
    args = p.parse_args(argv)
    policies = ["static", "nalar"] + ([] if args.no_ablation or args.quick else
                                      ["load-balanced", "hol-migration", "reassign"])
    window = (WINDOW_S[0], WINDOW_S[0] + 300.0) if args.quick else WINDOW_S
    loads = (1.0, 1.2) if args.quick else LOADS
    cost = load_cost_model(COST_MODEL)
    clock = Stopwatch()
    rows: list[dict[str, Any]] = []
    for load in loads:
        reqs = requests(load, window)
        mine: list[dict[str, Any]] = []
        for policy in policies:
            mine.append({"load": load, **simulate(policy, reqs, cost)})
            log(f"load {load}: {policy} p99 {mine[-1]['p99_s']:.1f} s "
                f"({clock.elapsed():.0f} s)")
        for r in mine[1:]:
            for key in ("p95_s", "p99_s"):
                r[f"{key[:3]}_reduction"] = 1 - r[key] / mine[0][key]
        rows += mine
    params = {"emulated": True, "simulated_service_times": COST_MODEL,
              "traces": [CODE.name, CONV.name], "window_s": list(window),
              "allocation": ALLOCATION, "min_instances": MIN_INSTANCES, "budget": BUDGET,
              "provision_s": PROVISION_S,
              "period_s": PERIOD_S, "loads": list(loads)}
    path = save("runtime_imbalance", params, rows)
    plot(rows, RESULTS / "runtime_imbalance.png")
    print("| load | policy | requests | mean s | P50 s | P95 s | P99 s | P95 / P99 reduction "
          "| migrations | provisioned |\n|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        red = (f"{r['p95_reduction']:.0%} / {r['p99_reduction']:.0%}"
               if "p99_reduction" in r else "")
        print(f"| {r['load']:g} | {r['policy']} | {r['requests']} | {r['mean_s']:.1f} | "
              f"{r['p50_s']:.1f} | {r['p95_s']:.1f} | {r['p99_s']:.1f} | {red} | "
              f"{r['migrations']} | {r['instances_provisioned']} |")
    log(f"wrote {path} and runtime_imbalance.png in {clock.elapsed():.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
