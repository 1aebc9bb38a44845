"""Load imbalance with a shifting branch mix (NALAR §6.1, the router workflow).

A classifier call, then the chat branch (one call) or the coding branch (plan, then
code; the second depends on the first). Requests replay the Azure LLM inference traces
of 2023-11-16 (CC-BY-4.0): the conversation trace is the chat branch and the code trace
the coding branch, on one clock, so the branch mix shifts the way the traces do (the
code service goes from 0 to hundreds of requests a minute and back). `load` compresses
time: 2 means twice the trace's rate. Latency is a request's arrival to its last
call's end. `pooled` runs every call on one shared pool of the same instances: not a
policy (no instance serves two agents' models at once), the bound on what moving
instances between the branches could give. `Clairvoyant` moves whole instances, paying
the model load like any policy, but knows the requests to come: a reference for what
reassignment itself could give here.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from bench.common import TRACES
from bench.runtime_sim import Setup, Sim, service_s, summary
from daemon.engines.sim.cost import CostModel
from daemon.replay.traces import load_azure
from scheduling.agents.policy import ControlDecision, ControlPolicy, ControlView, kill, provision

CODE = TRACES / "azure2023_AzureLLMInferenceTrace_code.csv"
CONV = TRACES / "azure2023_AzureLLMInferenceTrace_conv.csv"
# In the window the branches keep about 0.4 / 7.9 / 1.8 instances busy on average
# (Classifier / Chat / Coding): 14 instances, split in proportion, is ~72% utilisation
# at load 1; the coding branch's minute-to-minute demand swings between 0 and ~4.
ALLOCATION = {"Classifier": 1, "Chat": 10, "Coding": 3}
# The operator's min_instances: the bursty coding branch never drops below its static
# share (a cold start takes longer than a burst takes to build a queue); the steady
# chat branch keeps most of what its mean demand needs. The rest is the pool that
# reassignment moves. Measured, not assumed: with floors of one instance each (or
# Coding 2, Chat 6-8) the default policy strips the coding branch between bursts
# and its P99 at load 1.2 is no better, mostly worse (see bench/runtime_imbalance.py).
MIN_INSTANCES = {"Classifier": 1, "Chat": 8, "Coding": 3}
ROUTER = Setup(ALLOCATION, MIN_INSTANCES)
POOL = Setup({"Pool": ROUTER.budget})
WINDOW_S = (1200.0, 2400.0)  # minutes 20-40: code bursts over steady conversation
CLASSIFY_PROMPT, CLASSIFY_OUT, PLAN_OUT = 256, 4, 32


@dataclass(frozen=True)
class Req:
    rid: int
    arrival: float
    branch: str  # Chat | Coding
    prompt: int
    output: int


def requests(load: float, window: tuple[float, float] = WINDOW_S) -> list[Req]:
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


class RouterSim(Sim):
    def __init__(self, policy: ControlPolicy, cost: CostModel, pooled: bool = False,
                 setup: Setup | None = None) -> None:
        super().__init__(policy, setup or (POOL if pooled else ROUTER))
        self.cost = cost
        self.pooled = pooled
        self.reqs: dict[int, Req] = {}
        self.left: dict[int, int] = {}

    def _call(self, fid: str, r: Req, agent: str, prompt: int, out: int,
              deps: tuple[str, ...] = ()) -> None:
        self.work[fid] = service_s(self.cost, prompt, out)
        self.c.create(fid, f"s{r.rid}", "Pool" if self.pooled else agent, self.now, deps=deps)

    def arrive(self, r: Req) -> None:
        self.reqs[r.rid] = r
        self.left[r.rid] = 1
        self._call(f"{r.rid}.cls", r, "Classifier", min(r.prompt, CLASSIFY_PROMPT), CLASSIFY_OUT)

    def finished(self, fid: str, instance: str) -> None:
        rid_s, step = fid.split(".")
        r = self.reqs[int(rid_s)]
        if step == "cls":
            if r.branch == "Chat":
                self._call(f"{r.rid}.chat", r, "Chat", r.prompt, r.output)
            else:
                self.left[r.rid] = 2
                self._call(f"{r.rid}.plan", r, "Coding", r.prompt, PLAN_OUT)
                self._call(f"{r.rid}.code", r, "Coding", r.prompt + PLAN_OUT, r.output,
                           deps=(f"{r.rid}.plan",))
            return
        self.left[r.rid] -= 1
        if not self.left[r.rid]:
            self.latency[r.rid] = self.now - r.arrival
            self.c.forget_session(f"s{r.rid}")


def work_s(r: Req, cost: CostModel) -> dict[str, float]:
    """The request's service time per agent type."""
    cls = service_s(cost, min(r.prompt, CLASSIFY_PROMPT), CLASSIFY_OUT)
    if r.branch == "Chat":
        return {"Classifier": cls, "Chat": service_s(cost, r.prompt, r.output)}
    return {"Classifier": cls, "Coding": service_s(cost, r.prompt, PLAN_OUT)
            + service_s(cost, r.prompt + PLAN_OUT, r.output)}


class Clairvoyant(ControlPolicy):
    """Not a policy a controller could run: it reads the requests to come. Each step it
    splits the budget in proportion to each agent's work, held now plus arriving before
    an instance moved now would serve and `look_s` after, and moves instances (at least
    one instance of difference) toward that split. A reference, not a proven optimum."""

    name = "clairvoyant"

    def __init__(self, reqs: list[Req], cost: CostModel, setup: Setup,
                 look_s: float = 5.0) -> None:
        self.ahead = setup.provision_s + look_s
        self.budget = setup.budget
        self.arrivals = [r.arrival for r in reqs]
        self.done: dict[str, list[float]] = {a: [0.0] for a in setup.allocation}
        for r in reqs:  # work per agent arrived before each request, cumulated
            w = work_s(r, cost)
            for a, acc in self.done.items():
                acc.append(acc[-1] + w.get(a, 0.0))

    def decide(self, view: ControlView, now: float) -> list[ControlDecision]:
        lo, hi = (bisect.bisect_left(self.arrivals, t) for t in (now, now + self.ahead))
        n, need = {}, {}
        for a, acc in self.done.items():
            held = view.provisioned(a)
            timed = [i.mean_service_s for i in held if i.completed] or [0.0]
            n[a] = len(held)
            need[a] = sum(i.load for i in held) * sum(timed) / len(timed) + acc[hi] - acc[lo]
        scale = self.budget / (sum(need.values()) or 1.0)
        over = {a: n[a] - need[a] * scale for a in n}
        out: list[ControlDecision] = []
        taken: set[str] = set()
        while True:
            hot, cold = min(over, key=over.__getitem__), max(over, key=over.__getitem__)
            free = [i for i in view.instances_of(cold) if i.instance_id not in taken]
            floor = max(1, view.directives(cold).min_instances)
            if over[hot] > -1 or over[cold] < 1 or len(free) <= floor:
                return out
            victim = min(free, key=lambda i: (i.load, i.running)).instance_id
            taken.add(victim)
            out += [kill(victim, "clairvoyant"), provision(hot, reason="clairvoyant")]
            over[hot] += 1
            over[cold] -= 1


def simulate(policy: ControlPolicy, name: str, reqs: list[Req], cost: CostModel,
             pooled: bool = False, setup: Setup | None = None) -> dict[str, Any]:
    sim = RouterSim(policy, cost, pooled, setup)
    sim.run(((r.arrival, r) for r in reqs), len(reqs))
    groups = {b.lower(): [r.rid for r in reqs if r.branch == b] for b in ("Chat", "Coding")}
    return {"policy": name, **summary(sim, groups)}
