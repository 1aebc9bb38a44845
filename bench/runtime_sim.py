"""Emulated agent instances on a virtual clock under the real control layer: the part
the load-imbalance workloads (bench/runtime_imbalance.py, bench/runtime_analyst.py)
share.

Each instance runs one call at a time, for as long as the simulated engine's cost model
says (batch of one: the prompt's prefill, then one decode step per output token).
Everything else is real: local controllers, placement, migration, and the global
controller running the policy every `period_s`. The setup's instances are all the
hardware there is (`Setup.budget`): a provisioned instance starts loading (it serves
`provision_s` later) only when an instance's resources are free, so one that replaces a
killed instance waits for the killed one to drain, and one provisioned over the budget
waits, STARTING, until something dies. A policy cannot get more than the budget by
provisioning early.
"""

from __future__ import annotations

import heapq
import statistics
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from daemon.engines.sim.cost import CostModel, prefill_pairs
from scheduling.agents.cluster import Cluster
from scheduling.agents.policy import ControlPolicy, Directives, GlobalController

PROVISION_S = 5.0
PERIOD_S = 0.5


def service_s(cost: CostModel, prompt: int, output: int, cached: int = 0) -> float:
    """Batch of one: prefill what the cache does not hold, then decode step by step."""
    new = max(0, prompt - cached)
    t = cost.step_time(new, 0, 0, prefill_pairs(new, prompt - new)) if new else 0.0
    return t + sum(cost.step_time(0, 1, prompt + k) for k in range(output))


@dataclass(frozen=True)
class Setup:
    allocation: dict[str, int]  # instances per agent type at the start
    min_instances: dict[str, int] = field(default_factory=dict)
    provision_s: float = PROVISION_S
    period_s: float = PERIOD_S

    @property
    def budget(self) -> int:
        return sum(self.allocation.values())


class Sim(ABC):
    """Subclasses say what an arrival creates (`arrive`), what a finished call leads to
    (`finished`), and may price a call by where it runs (`duration`)."""

    def __init__(self, policy: ControlPolicy, setup: Setup) -> None:
        self.setup = setup
        top = setup.budget - (len(setup.allocation) - 1)  # every other type keeps one
        agents = {a: Directives(min_instances=setup.min_instances.get(a, 1), max_instances=top)
                  for a in setup.allocation}
        self.c = Cluster(agents, cold_start=True)
        for agent, n in setup.allocation.items():
            for _ in range(n):
                self.c.add_instance(agent, now=0.0)
        self.c.take_events()  # the initial allocation is not a reassignment
        self.gc = GlobalController(policy, setup.period_s)
        self.now = 0.0
        self.events: list[tuple[float, int, str, Any]] = []
        self.seq = 0
        self.latency: dict[Any, float] = {}
        self.work: dict[str, float] = {}  # call -> its service time, when known up front
        self.moves = 0
        self.provisioned = 0
        self.free = 0  # instances' resources not held by any instance
        self.pending: list[str] = []  # provisioned, waiting for resources to load on

    # --- what a workload defines ---------------------------------------------------------

    @abstractmethod
    def arrive(self, data: Any) -> None:
        """A request arrives: create its first calls."""

    @abstractmethod
    def finished(self, fid: str, instance: str) -> None:
        """The call ended (the cluster knows already): create what follows it."""

    def duration(self, fid: str, instance: str) -> float:
        return self.work.pop(fid)

    # --- the loop --------------------------------------------------------------------------

    def at(self, t: float, kind: str, data: Any) -> None:
        self.seq += 1
        heapq.heappush(self.events, (t, self.seq, kind, data))

    def run(self, arrivals: Iterable[tuple[float, Any]], expected: int) -> None:
        for t, data in arrivals:
            self.at(t, "arrive", data)
        self.at(self.setup.period_s, "tick", None)
        handlers: dict[str, Callable[[Any], None]] = {
            "arrive": self.arrive, "done": self._done, "tick": self._tick,
            "ready": self.c.activate}
        while self.events and len(self.latency) < expected:
            self.now, _, kind, data = heapq.heappop(self.events)
            handlers[kind](data)
            self._dispatch()

    def _done(self, data: tuple[str, str]) -> None:
        inst, fid = data
        self.c.finish(inst, fid, None, True, self.now)
        self._instance_events()
        self.finished(fid, inst)

    def _tick(self, _: Any) -> None:
        step = self.gc.step(self.c.view(self.now), self.now)
        self.c.apply(step.accepted, self.now)
        self._instance_events()
        self.at(self.now + self.setup.period_s, "tick", None)

    def _instance_events(self) -> None:
        for e in self.c.take_events():
            kind = e["event"]
            if kind == "future.migrated":
                self.moves += 1
            elif kind == "instance.dead":
                self.free += 1
            elif kind == "instance.provisioned":
                self.provisioned += 1
                self.pending.append(e["instance"])
        while self.free and self.pending:
            self.free -= 1
            self.at(self.now + self.setup.provision_s, "ready", self.pending.pop(0))

    def _dispatch(self) -> None:
        for inst in self.c.startable():
            started = self.c.start_next(inst, self.now)
            if started is not None:
                fid = started.future.future_id
                self.at(self.now + self.duration(fid, inst), "done", (inst, fid))


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))] if s else float("nan")


def summary(sim: Sim, groups: dict[str, list[Any]]) -> dict[str, Any]:
    """Latency percentiles overall and per group of requests, and what the policy did."""
    lat = list(sim.latency.values())
    return {"requests": len(lat), "mean_s": statistics.fmean(lat), "p50_s": pct(lat, 0.5),
            "p95_s": pct(lat, 0.95), "p99_s": pct(lat, 0.99),
            **{f"{g}_p99_s": pct([sim.latency[k] for k in keys if k in sim.latency], 0.99)
               for g, keys in groups.items()},
            "migrations": sim.moves, "instances_provisioned": sim.provisioned,
            "duration_s": sim.now}
