"""The global controller in the daemon: every `period_s`, over every live run.

Each run's sandbox posts its view (instances with their local controllers' metrics,
live agent calls, installed rules, the capacity its agents reserve from) every 0.25 s
and gets back the decisions queued for it (`report`). Every period the loop joins the
latest views into one `ControlView` - agent types and instances named
`<run id>/<name>`, so no decision can cross runs, and each run a resource pool of its
own with its capacity - runs the active policy on a worker thread, and queues each
accepted decision for its run with the run's own names. It is never on a call's path:
sandboxes place and run calls with their local controllers and only install what
comes back.

The active policy is the `control` layer's version in the policy registry
(daemon/policies/agents_layer.py): the registry installs a `ControlGuard`
(control_guard.py) here at start and swaps versions through it, so an activation lands
between two periods and a failing version is rolled back within the step it fails in.
The loop sleeps the active policy's `period_s` between steps.

Every decision, accepted or rejected (a rejection is traced once until it changes), is
a `control.decision` trace event of its run, tagged with the policy and its version, or
`operator`.

The policy's hooks (`on_instance_change`, `on_session_end`) run on the events the views
and the runs' ends reveal: see control_hooks.py. Hooks and steps take turns (`stepping`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import msgspec

from daemon.policies.agents_guard import ControlGuard
from daemon.policies.agents_layer import DEFAULT_CONTROL_POLICY
from daemon.policies.swap import Active
from daemon.runtime.directives import DirectiveApplier
from daemon.runtime.hooks import HookRunner
from daemon.runtime.runs import Run, RunController
from scheduling.agents.policies import make_control_policy
from scheduling.agents.policy import (
    ControlDecision,
    ControlStep,
    ControlView,
    Directives,
    FutureStatus,
    FutureView,
    InstanceState,
    InstanceView,
    Kill,
    Migrate,
    Provision,
    Route,
    Rules,
    SetPriority,
    Validator,
    WeightedRoute,
    decision_from_dict,
    decision_to_dict,
)

log = logging.getLogger("agentd.instances")

REPEAT_AFTER_S = 2.0  # the same decision is not sent again within this (views lag)
_TRACE_KEYS = frozenset({"kind", "reason", "session_id", "program_id", "run_id", "ts"})


class WireInstance(msgspec.Struct):
    instance_id: str
    agent_type: str
    node: str = "local"
    state: str = "active"
    slots: int = 1
    queued: int = 0
    waiting: int = 0
    running: int = 0
    completed: int = 0
    mean_service_s: float = 0.0
    mean_wait_s: float = 0.0
    oldest_queued_at: float | None = None
    utilisation: float = 0.0


class WireFuture(msgspec.Struct):
    future_id: str
    session_id: str
    agent_type: str
    executor: str | None
    status: str
    created_at: float
    seq: int = 0
    creator: str = "driver"
    dependencies: list[str] = []
    consumers: list[str] = []
    stage: int = 0
    attempt: int = 0
    turn: int | None = None
    queued_at: float | None = None
    started_at: float | None = None
    hops: int = 0


class WireDirectives(msgspec.Struct):
    stateful: bool = False
    batchable: bool = False
    preemptable: str | bool | None = None  # False: explicitly not (directives.py)
    min_instances: int = 1
    max_instances: int = 1
    resources: dict[str, float] = {}
    max_batch: int = 8


class WireRules(msgspec.Struct):
    priorities: dict[str, float] = {}
    routes: list[tuple[str, str, str]] = []
    pins: list[tuple[str, str, str]] = []
    weights: list[tuple[str, list[str], list[float]]] = []


class WireView(msgspec.Struct):
    instances: list[WireInstance] = []
    futures: list[WireFuture] = []
    agents: dict[str, WireDirectives] = {}
    rules: WireRules = msgspec.field(default_factory=WireRules)
    capacity: dict[str, float] | None = None  # None: the sandbox reserves nothing


class ControlReport(msgspec.Struct, forbid_unknown_fields=True):
    view: WireView


@dataclass
class RunView:
    """One run's latest view, in its own names."""

    view: ControlView
    received_at: float


def parse_view(wire: WireView) -> ControlView:
    """ValueError names what does not fit (the sandbox runs user code: do not trust it)."""
    try:
        instances = [InstanceView(i.instance_id, i.agent_type, i.node, InstanceState(i.state),
                                  i.slots, i.queued, i.waiting, i.running, i.completed,
                                  i.mean_service_s, i.mean_wait_s, i.oldest_queued_at,
                                  i.utilisation)
                     for i in wire.instances]
        futures = [FutureView(f.future_id, f.session_id, f.agent_type, f.executor,
                              FutureStatus(f.status), f.created_at, f.seq, f.creator,
                              tuple(f.dependencies), tuple(f.consumers), f.stage, f.attempt,
                              f.turn, f.queued_at, f.started_at, f.hops)
                   for f in wire.futures]
    except ValueError as exc:
        raise ValueError(f"view: {exc}") from None
    agents = {n: Directives(d.stateful, d.batchable, d.preemptable,
                            d.min_instances, d.max_instances, d.resources, d.max_batch)
              for n, d in wire.agents.items()}
    r = wire.rules
    rules = Rules(dict(r.priorities), {}, {(s, t): i for s, t, i in r.routes},
                  {(s, t): i for s, t, i in r.pins},
                  {t: (tuple(i), tuple(w)) for t, i, w in r.weights})
    capacity = None if wire.capacity is None else {"": dict(wire.capacity)}
    return ControlView(futures, instances, agents, rules, capacity=capacity)


def joined_view(views: dict[str, RunView]) -> ControlView:
    """One view of every run, names prefixed with `<run id>/`."""
    futures: list[FutureView] = []
    instances: list[InstanceView] = []
    agents: dict[str, Directives] = {}
    priorities: dict[str, float] = {}
    routes: dict[tuple[str, str], str] = {}
    pins: dict[tuple[str, str], str] = {}
    weights: dict[str, tuple[tuple[str, ...], tuple[float, ...]]] = {}
    capacity: dict[str, dict[str, float]] = {}
    pools: dict[str, str] = {}
    for rid, rv in views.items():
        p = f"{rid}/"
        v = rv.view
        if "" in v.capacity:
            capacity[rid] = dict(v.capacity[""])
        pools |= {p + n: rid for n in v.agent_types()}
        instances += [i._replace(instance_id=p + i.instance_id, agent_type=p + i.agent_type)
                      for i in v.instances]
        futures += [f._replace(future_id=p + f.future_id, agent_type=p + f.agent_type,
                               executor=None if f.executor is None else p + f.executor,
                               dependencies=tuple(p + d for d in f.dependencies),
                               consumers=tuple(p + c for c in f.consumers))
                    for f in v.futures]
        agents |= {p + n: d for n, d in v.agents.items()}
        priorities |= v.rules.priorities
        routes |= {(s, p + t): p + i for (s, t), i in v.rules.routes.items()}
        pins |= {(s, p + t): p + i for (s, t), i in v.rules.pins.items()}
        weights |= {p + t: (tuple(p + i for i in ii), w) for t, (ii, w) in
                    v.rules.weights.items()}
    return ControlView(futures, instances, agents, Rules(priorities, {}, routes, pins, weights),
                       capacity=capacity, pools=pools)


def _local(d: ControlDecision, views: dict[str, RunView]) -> list[tuple[str, ControlDecision]]:
    """The run(s) a decision of the joined view is for, with the run's own names."""
    def split(name: str) -> tuple[str, str]:
        rid, _, rest = name.partition("/")
        return rid, rest

    if isinstance(d, Route):
        rid, agent = split(d.agent_type)
        inst = None if d.instance_id is None else split(d.instance_id)[1]
        return [(rid, Route(agent, inst, d.session_id, d.reason))]
    if isinstance(d, WeightedRoute):
        rid, agent = split(d.agent_type)
        return [(rid, WeightedRoute(agent, tuple(split(i)[1] for i in d.instances), d.weights,
                                    d.reason))]
    if isinstance(d, SetPriority):
        if d.agent_type is not None:
            rid, agent = split(d.agent_type)
            return [(rid, SetPriority(d.session_id, d.value, agent, d.reason))]
        return [(rid, d) for rid, rv in views.items()
                if any(f.session_id == d.session_id for f in rv.view.futures)]
    if isinstance(d, Migrate):
        rid, src = split(d.source)
        fid = None if d.future_id is None else split(d.future_id)[1]
        return [(rid, Migrate(d.session_id, src, split(d.destination)[1], fid, d.reason))]
    if isinstance(d, Kill):
        rid, inst = split(d.instance_id)
        return [(rid, Kill(inst, d.reason))]
    rid, agent = split(d.agent_type)
    return [(rid, Provision(agent, d.node, d.reason))]


def _builtin_guard() -> ControlGuard:
    """Until the registry installs its guard (and in a daemon without one)."""
    policy = make_control_policy(DEFAULT_CONTROL_POLICY)
    return ControlGuard(Active(DEFAULT_CONTROL_POLICY, 1, policy))


@dataclass
class ControlLoop:
    runs: RunController
    guard: ControlGuard = field(default_factory=_builtin_guard)
    views: dict[str, RunView] = field(default_factory=dict)
    pending: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    last_step: dict[str, Any] | None = None
    stepping: asyncio.Lock = field(default_factory=asyncio.Lock)
    _sent: dict[tuple[str, str], float] = field(default_factory=dict)
    _rejected: dict[str, set[str]] = field(default_factory=dict)
    _task: asyncio.Task[None] | None = None

    def __post_init__(self) -> None:
        self.hooks = HookRunner(self)
        self.directives = DirectiveApplier(self.runs)

    # --- the sandboxes' side ------------------------------------------------------------

    def report(self, run: Run, wire: WireView) -> list[dict[str, Any]]:
        view = parse_view(wire)
        self.views[run.id] = RunView(view, time.time())
        self.hooks.reported(run, view)
        self.directives.reported(run, view)
        return self.pending.pop(run.id, [])

    def run_view(self, run: Run) -> ControlView | None:
        rv = self.views.get(run.id)
        return None if rv is None else rv.view

    # --- the operator's side ------------------------------------------------------------

    def submit(self, run: Run, raw: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Queue operator decisions for one run, in the run's names; each is checked
        against the run's latest view. ValueError: one is malformed (nothing queued)."""
        decisions = [decision_from_dict(d) for d in raw]
        view = self.run_view(run)
        if view is None:
            raise LookupError(f"run '{run.id}' has not reported a view yet (no agent call)")
        checker = Validator(view)
        results = []
        for d in decisions:
            problem = checker.check(d)
            self._queue(run, d, "operator", problem, force=True)
            results.append({"decision": decision_to_dict(d), "ok": problem is None,
                            "reason": problem})
        return results

    # --- the policy registry's side -----------------------------------------------------

    def install(self, guard: ControlGuard) -> None:
        """Run the registry's guard from the next period on (at the registry's start)."""
        self.guard = guard

    def snapshot(self, max_runs: int) -> ControlView:
        """The joined view of the runs that reported last, for validating a version
        against what the daemon sees now (empty when no run reports)."""
        live = self.live()
        return joined_view(dict(list(live.items())[-max_runs:]))

    @staticmethod
    def joined(live: dict[str, RunView]) -> ControlView:
        return joined_view(live)

    # --- the loop -----------------------------------------------------------------------

    def start(self) -> None:
        # The registry reaches the loop through the core, as it reaches core.kv and core.slo.
        self.runs.core.control = self
        self.runs.on_end += [self.hooks.run_ended, self.directives.forget]
        self.hooks.start()
        self._task = asyncio.create_task(self._loop(), name="control-loop")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self.hooks.stop()
        for listener in (self.hooks.run_ended, self.directives.forget):
            with contextlib.suppress(ValueError):
                self.runs.on_end.remove(listener)
        if getattr(self.runs.core, "control", None) is self:
            self.runs.core.control = None

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.guard.period_s)
            try:
                await self.tick()
            except Exception:
                log.exception("control loop step failed; next period tries again")

    async def tick(self) -> ControlStep | None:
        async with self.stepping:
            live = self.live()
            if not live:
                return None
            joined = joined_view(live)
            t0 = time.perf_counter()
            active, step = await self.guard.step(joined, time.time())
        self.last_step = {"policy": active.name, "version": active.version, "at": step.at,
                          "runs": len(live), "futures": len(joined.futures),
                          "instances": len(joined.instances), "accepted": len(step.accepted),
                          "rejected": len(step.rejected),
                          "duration_ms": (time.perf_counter() - t0) * 1e3}
        self._dispatch(step, live, active)
        return step

    def live(self) -> dict[str, RunView]:
        for rid in [r for r in self.views if r not in self.runs.runs or self.runs.runs[r].ended]:
            del self.views[rid]
            self.pending.pop(rid, None)
            self._rejected.pop(rid, None)
        return dict(self.views)

    def _dispatch(self, step: ControlStep, live: dict[str, RunView], active: Active) -> None:
        rejected_now: dict[str, set[str]] = {}
        for d in step.accepted:
            self._queue_local(d, live, active, None)
        for r in step.rejected:
            for rid, local in _local(r.decision, live):
                key = f"{decision_to_dict(local)}: {r.reason}"
                rejected_now.setdefault(rid, set()).add(key)
                if rid in live and key not in self._rejected.get(rid, set()):
                    self._queue(self.runs.runs[rid], local, active.name, r.reason,
                                active.version)
        self._rejected = rejected_now

    def queue_step(self, step: ControlStep, live: dict[str, RunView], active: Active) -> None:
        """A hook's decisions (rejections traced each time: an event happens once)."""
        for d in step.accepted:
            self._queue_local(d, live, active, None)
        for r in step.rejected:
            self._queue_local(r.decision, live, active, r.reason)

    def _queue_local(self, d: ControlDecision, live: dict[str, RunView], active: Active,
                     problem: str | None) -> None:
        """For each live run the decision names (a policy may name one that has ended)."""
        for rid, local in _local(d, live):
            if rid in live:
                self._queue(self.runs.runs[rid], local, active.name, problem, active.version)

    def _queue(self, run: Run, d: ControlDecision, by: str, problem: str | None,
               version: int | None = None, force: bool = False) -> None:
        data = decision_to_dict(d)
        key = (run.id, repr(data))
        now = time.time()
        if problem is None and not force and now - self._sent.get(key, 0.0) < REPEAT_AFTER_S:
            return  # already sent; the view it was based on has not caught up yet
        fields = {f"decision_{k}" if k in _TRACE_KEYS else k: v for k, v in data.items()}
        self.runs.trace(run, "control.decision", by=by, policy_version=version,
                        ok=problem is None, reason=problem, **fields)
        if problem is not None:
            return
        self._sent[key] = now
        self.pending.setdefault(run.id, []).append(data)
        self._forget_old(now)

    def _forget_old(self, now: float) -> None:
        if len(self._sent) > 10_000:
            self._sent = {k: t for k, t in self._sent.items() if now - t < REPEAT_AFTER_S}

    def status(self) -> dict[str, Any]:
        active = self.guard.current
        return {"policy": active.name, "version": active.version,
                "period_s": self.guard.period_s, "in_probation": self.guard.in_probation(),
                "runs_reporting": len(self.views), "last_step": self.last_step}
