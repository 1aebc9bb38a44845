"""Two-level control (NALAR §4): the read-only view, the policy primitives of Table 2,
the policy interface, and the global controller.

The global controller runs the operator's policy every `period_s` over a `ControlView`
(futures, sessions, instances, metrics) and returns validated decisions. A host (the
daemon, a sandbox, the benchmark) installs them on the event-driven local controllers
through a `Cluster` (scheduling/agents/cluster.py). Nothing here runs per future: the
per-future path is `Router.place` and `LocalController` (control_rules.py,
control_local.py), which read the rules these decisions installed.

Policies keep no state between calls: what is installed (priorities, routes, weights,
pins) is part of the view, so a policy emits only what it wants changed and can be
swapped between two steps without losing anything.
"""

from __future__ import annotations

import dataclasses
import math
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, ClassVar, NamedTuple

from scheduling.agents.resources import Resources, plus, shortfall, total

DRIVER = "driver"


class FutureStatus(Enum):
    WAITING = "waiting"  # at its executor, a dependency value (or session state) missing
    QUEUED = "queued"  # ready, in its executor's local queue
    RUNNING = "running"
    MIGRATING = "migrating"  # taken off its source's queue, not yet active at the target
    DONE = "done"
    FAILED = "failed"


MOVABLE = frozenset({FutureStatus.WAITING, FutureStatus.QUEUED})


class FutureView(NamedTuple):
    """One agent call as the controllers see it (NALAR Table 3 plus scheduling facts).

    `stage` is the call's depth in the session's dataflow graph (1 + the deepest of its
    dependencies and its creator); `attempt` counts earlier calls with the same call key
    in the session (a retry; the SDK's key is the method and its first argument); `turn`
    orders a stateful agent's calls per session.
    `hops` counts its migrations: messages name the hop they are meant for, so one that
    reaches an instance the call left and will come back to waits there.
    A NamedTuple, not a dataclass: local controllers replace one on every event.
    """

    future_id: str
    session_id: str
    agent_type: str
    executor: str | None  # None: waiting for room for an instance of its type
    status: FutureStatus
    created_at: float
    seq: int = 0
    creator: str = DRIVER
    dependencies: tuple[str, ...] = ()
    consumers: tuple[str, ...] = ()
    stage: int = 0
    attempt: int = 0
    turn: int | None = None
    queued_at: float | None = None
    started_at: float | None = None
    hops: int = 0  # migrations so far


class InstanceState(Enum):
    STARTING = "starting"  # provisioned, not serving yet (loading its model, say)
    ACTIVE = "active"
    DRAINING = "draining"  # killed: takes no new futures, finishes what runs
    DEAD = "dead"


class InstanceView(NamedTuple):
    """One agent instance and its local controller's metrics."""

    instance_id: str
    agent_type: str
    node: str = "local"
    state: InstanceState = InstanceState.ACTIVE
    slots: int = 1
    queued: int = 0
    waiting: int = 0
    running: int = 0
    completed: int = 0
    mean_service_s: float = 0.0  # moving average of run time
    mean_wait_s: float = 0.0  # moving average of queue wait
    oldest_queued_at: float | None = None
    utilisation: float = 0.0  # fraction of the last ~30 s it ran calls (time-decayed)

    @property
    def load(self) -> int:
        return self.queued + self.waiting + self.running

    @property
    def alive(self) -> bool:
        return self.state is InstanceState.ACTIVE

    @property
    def provisioned(self) -> bool:
        """Holds its resources: serving, or starting to."""
        return self.state in (InstanceState.ACTIVE, InstanceState.STARTING)

    @property
    def idle(self) -> bool:
        return self.alive and self.queued == 0 and self.running < self.slots


class SessionView(NamedTuple):
    """A session's live calls, summed up: what session-level policies read.

    `state_s`: the host's estimate of rebuilding the session's state on another
    instance (its KV cache recomputed, say), in seconds; 0 where the host prices none.
    """

    session_id: str
    live: int
    deepest_stage: int
    max_attempt: int
    state_s: float = 0.0


@dataclass(frozen=True)
class Directives:
    """NALAR Table 1, per agent type."""

    stateful: bool = False
    batchable: bool = False
    preemptable: str | bool | None = None  # a preempt method's name, or False: never
    min_instances: int = 1
    max_instances: int = 1
    resources: Mapping[str, float] = field(default_factory=dict)
    max_batch: int = 8  # calls a batchable instance runs at once


@dataclass(frozen=True)
class Rules:
    """What the global controller has installed (and the router pinned), as of the view."""

    priorities: Mapping[str, float] = field(default_factory=dict)
    agent_priorities: Mapping[tuple[str, str], float] = field(default_factory=dict)
    routes: Mapping[tuple[str, str], str] = field(default_factory=dict)
    pins: Mapping[tuple[str, str], str] = field(default_factory=dict)
    weights: Mapping[str, tuple[tuple[str, ...], tuple[float, ...]]] = field(
        default_factory=dict)


class ControlView:
    """A read-only snapshot. Indexes are built on first use, once per view.

    `capacity`: what each pool's instances may reserve (control_resources.py), by pool;
    `pools`: each agent type's pool (default ""). A pool without a capacity is unbounded.
    """

    def __init__(self, futures: Sequence[FutureView], instances: Sequence[InstanceView],
                 agents: Mapping[str, Directives], rules: Rules | None = None,
                 sessions: Iterable[SessionView] | None = None,
                 capacity: Mapping[str, Resources] | None = None,
                 pools: Mapping[str, str] | None = None) -> None:
        self.futures = tuple(futures)
        self.instances = tuple(instances)
        self.agents = dict(agents)
        self.rules = rules or Rules()
        self.capacity = dict(capacity or {})
        self.pools = dict(pools or {})
        self._instance = {i.instance_id: i for i in self.instances}
        self._at: dict[str | None, list[FutureView]] | None = None
        self._by_session: dict[str, list[FutureView]] | None = None
        self._sessions = None if sessions is None else {s.session_id: s for s in sessions}

    @property
    def sessions(self) -> Mapping[str, SessionView]:
        """Per session: live calls, deepest stage, most retries. A host that keeps
        these as calls come and go passes them in; else they are summed from futures."""
        if self._sessions is None:
            acc: dict[str, SessionView] = {}
            for f in self.futures:
                old = acc.get(f.session_id)
                acc[f.session_id] = SessionView(f.session_id, 1, f.stage, f.attempt) \
                    if old is None else SessionView(f.session_id, old.live + 1,
                                                    max(old.deepest_stage, f.stage),
                                                    max(old.max_attempt, f.attempt))
            self._sessions = acc
        return self._sessions

    def instance(self, instance_id: str) -> InstanceView | None:
        return self._instance.get(instance_id)

    def instances_of(self, agent_type: str, alive: bool = True) -> list[InstanceView]:
        return [i for i in self.instances
                if i.agent_type == agent_type and (i.alive or not alive)]

    def provisioned(self, agent_type: str) -> list[InstanceView]:
        """Instances that hold resources: serving or starting."""
        return [i for i in self.instances if i.agent_type == agent_type and i.provisioned]

    def agent_types(self) -> list[str]:
        return list(dict.fromkeys([*self.agents, *(i.agent_type for i in self.instances)]))

    def directives(self, agent_type: str) -> Directives:
        return self.agents.get(agent_type) or Directives()

    def pool_of(self, agent_type: str) -> str:
        return self.pools.get(agent_type, "")

    def reserved(self, pool: str) -> dict[str, float]:
        """What the pool's provisioned instances reserve (a killed one reserves nothing)."""
        return total(self.directives(i.agent_type).resources for i in self.instances
                     if i.provisioned and self.pool_of(i.agent_type) == pool)

    def futures_at(self, instance_id: str | None) -> list[FutureView]:
        if self._at is None:
            at: dict[str | None, list[FutureView]] = {}
            for f in self.futures:
                at.setdefault(f.executor, []).append(f)
            self._at = at
        return self._at.get(instance_id, [])

    def waiting_for_room(self) -> dict[str, list[FutureView]]:
        """Per agent type, its calls that wait for room for an instance (no executor
        yet: control_waiting.py), oldest first; demand no instance's load shows."""
        by: dict[str, list[FutureView]] = {}
        for f in sorted(self.futures_at(None), key=lambda f: (f.created_at, f.seq)):
            by.setdefault(f.agent_type, []).append(f)
        return by

    def by_session(self) -> dict[str, list[FutureView]]:
        """Live futures by session."""
        if self._by_session is None:
            by: dict[str, list[FutureView]] = {}
            for f in self.futures:
                by.setdefault(f.session_id, []).append(f)
            self._by_session = by
        return self._by_session

    def waiting_sessions(self, instance_id: str) -> set[str]:
        """Sessions with a call queued on the instance (NALAR Fig. 6's test)."""
        return {f.session_id for f in self.futures_at(instance_id)
                if f.status is FutureStatus.QUEUED}

    def priority(self, session_id: str, agent_type: str | None = None) -> float:
        if agent_type is not None:
            value = self.rules.agent_priorities.get((session_id, agent_type))
            if value is not None:
                return value
        return self.rules.priorities.get(session_id, 0.0)


# --- the primitives (NALAR Table 2) ---------------------------------------------------


@dataclass(frozen=True)
class Route:
    """Send the session's calls of `agent_type` to `instance_id` (None: drop the route)."""

    agent_type: str
    instance_id: str | None
    session_id: str
    reason: str = ""


@dataclass(frozen=True)
class WeightedRoute:
    """Spread new calls of `agent_type` over `instances` in proportion to `weights`."""

    agent_type: str
    instances: tuple[str, ...]
    weights: tuple[float, ...]
    reason: str = ""


@dataclass(frozen=True)
class SetPriority:
    """Higher runs first; per agent type when `agent_type` is set."""

    session_id: str
    value: float
    agent_type: str | None = None
    reason: str = ""


@dataclass(frozen=True)
class Migrate:
    """Move the session's not-yet-started calls (one call: `future_id`) and its state."""

    session_id: str
    source: str
    destination: str
    future_id: str | None = None
    reason: str = ""


@dataclass(frozen=True)
class Kill:
    instance_id: str
    reason: str = ""


@dataclass(frozen=True)
class Provision:
    agent_type: str
    node: str | None = None
    reason: str = ""


ControlDecision = Route | WeightedRoute | SetPriority | Migrate | Kill | Provision


def route(agent_type: str, target: str | Sequence[str] | None, session: str | None = None,
          weights: Sequence[float] | None = None, reason: str = "") -> ControlDecision:
    """Both forms of Table 2's `route`: (session, agent, instance) and (agent, instances,
    weights)."""
    if session is not None:
        if target is not None and not isinstance(target, str):
            raise TypeError("a session route names one instance")
        return Route(agent_type, target, session, reason)
    if target is None or isinstance(target, str):
        raise TypeError("a weighted route names a list of instances")
    targets = tuple(target)
    return WeightedRoute(agent_type, targets,
                         tuple(weights) if weights is not None else (1.0,) * len(targets), reason)


def set_priority(session: str, value: float, agent: str | None = None,
                 reason: str = "") -> SetPriority:
    return SetPriority(session, value, agent, reason)


def migrate(session: str, source: str, destination: str, future_id: str | None = None,
            reason: str = "") -> Migrate:
    return Migrate(session, source, destination, future_id, reason)


def kill(instance: str, reason: str = "") -> Kill:
    return Kill(instance, reason)


def provision(agent_type: str, node: str | None = None, reason: str = "") -> Provision:
    return Provision(agent_type, node, reason)


# --- the policy interface -------------------------------------------------------------


class ControlPolicy(ABC):
    """The `control` layer: an operator's policy over the whole workflow view.

    `decide` runs on the global controller every `period_s`; the hooks run when an
    instance appears or disappears and when a session's last live call ends. All return
    decisions; none may keep state between calls (the view carries what is installed).
    """

    name: ClassVar[str]
    period_s: ClassVar[float] = 0.5

    @abstractmethod
    def decide(self, view: ControlView, now: float) -> list[ControlDecision]:
        """The periodic step."""

    def on_instance_change(self, view: ControlView, instance_id: str,
                           now: float) -> list[ControlDecision]:
        """An instance was provisioned, killed or died."""
        return []

    def on_session_end(self, view: ControlView, session_id: str,
                       now: float) -> list[ControlDecision]:
        """The session has no live call left: drop what was installed for it."""
        drop: list[ControlDecision] = [
            Route(t, None, s, "session ended") for (s, t) in view.rules.routes if s == session_id]
        if session_id in view.rules.priorities:
            drop.append(SetPriority(session_id, 0.0, None, "session ended"))
        return drop


class Combined(ControlPolicy):
    """Several policies in order; later ones see the same view, not earlier decisions."""

    name = "combined"

    def __init__(self, *parts: ControlPolicy, name: str | None = None) -> None:
        self.parts = parts
        if name is not None:
            self.name = name  # type: ignore[misc]

    def decide(self, view: ControlView, now: float) -> list[ControlDecision]:
        return [d for p in self.parts for d in p.decide(view, now)]

    def on_instance_change(self, view: ControlView, instance_id: str,
                           now: float) -> list[ControlDecision]:
        return [d for p in self.parts for d in p.on_instance_change(view, instance_id, now)]

    def on_session_end(self, view: ControlView, session_id: str,
                       now: float) -> list[ControlDecision]:
        # parts that keep the base hook return the same drops: send each once
        return list(dict.fromkeys(d for p in self.parts
                                  for d in p.on_session_end(view, session_id, now)))


# --- the global controller ------------------------------------------------------------


@dataclass(frozen=True)
class Rejected:
    decision: ControlDecision
    reason: str


@dataclass(frozen=True)
class ControlStep:
    policy: str
    at: float
    accepted: tuple[ControlDecision, ...]
    rejected: tuple[Rejected, ...]


class GlobalController:
    """Runs one policy over views; swapping the policy takes effect at the next step."""

    def __init__(self, policy: ControlPolicy, period_s: float | None = None) -> None:
        self.policy = policy
        self.period_s = period_s if period_s is not None else policy.period_s
        self.last_step: float | None = None

    def swap(self, policy: ControlPolicy) -> ControlPolicy:
        old, self.policy = self.policy, policy
        return old

    def due(self, now: float) -> bool:
        return self.last_step is None or now - self.last_step >= self.period_s

    def step(self, view: ControlView, now: float) -> ControlStep:
        self.last_step = now
        return self._checked(self.policy.decide(view, now), view, now)

    def instance_changed(self, view: ControlView, instance_id: str, now: float) -> ControlStep:
        return self._checked(self.policy.on_instance_change(view, instance_id, now), view, now)

    def session_ended(self, view: ControlView, session_id: str, now: float) -> ControlStep:
        return self._checked(self.policy.on_session_end(view, session_id, now), view, now)

    def _checked(self, decisions: Iterable[ControlDecision], view: ControlView,
                 now: float) -> ControlStep:
        checker = Validator(view)
        accepted: list[ControlDecision] = []
        rejected: list[Rejected] = []
        for d in decisions:
            problem = checker.check(d)
            if problem is None:
                accepted.append(d)
            else:
                rejected.append(Rejected(d, problem))
        return ControlStep(self.policy.name, now, tuple(accepted), tuple(rejected))


class Validator:
    """Checks decisions against the view and against each other within one step.

    Each decision is judged as if the ones accepted before it had taken effect, and
    only those: a policy's reassignment (kill one of A, provision one of B in the room
    it frees) gets its provision refused too when the kill is refused. So a kill the
    cluster would refuse for what the view shows is refused here: accepted here, then
    refused there, it would have freed room for the rest of the step (an instance over
    max_instances: the cluster checks only the capacity when it provisions).
    """

    def __init__(self, view: ControlView) -> None:
        self.view = view
        self.alive_delta: dict[str, int] = {}
        self.killed: set[str] = set()
        self.reserved: dict[str, dict[str, float]] = {}  # pool -> as of this step's decisions
        # session routes this step's decisions set or dropped, over the view's
        self.routes: dict[tuple[str, str], str | None] = {}

    def check(self, d: ControlDecision) -> str | None:
        if isinstance(d, Route):
            problem = self._route(d)
            if problem is None:
                self.routes[(d.session_id, d.agent_type)] = d.instance_id
            return problem
        if isinstance(d, WeightedRoute):
            return self._weighted(d)
        if isinstance(d, SetPriority):
            return None if math.isfinite(d.value) else "priority must be a finite number"
        if isinstance(d, Migrate):
            return self._migrate(d)
        if isinstance(d, Kill):
            return self._kill(d)
        return self._provision(d)

    def _live(self, instance_id: str, agent_type: str) -> str | None:
        inst = self.view.instance(instance_id)
        if inst is None:
            return f"unknown instance {instance_id!r}"
        if inst.agent_type != agent_type:
            return f"instance {instance_id!r} runs {inst.agent_type}, not {agent_type}"
        if not inst.alive or instance_id in self.killed:
            return f"instance {instance_id!r} is {inst.state.value}"
        return None

    def _route(self, d: Route) -> str | None:
        if d.instance_id is None:
            return None
        pinned = self.view.rules.pins.get((d.session_id, d.agent_type))
        if pinned is not None and pinned != d.instance_id:
            return f"{d.agent_type} is stateful: session {d.session_id} stays on {pinned}"
        return self._live(d.instance_id, d.agent_type)

    def _weighted(self, d: WeightedRoute) -> str | None:
        if len(d.instances) != len(d.weights) or not d.instances:
            return "a weighted route needs one weight per instance"
        if any(not math.isfinite(w) or w < 0 for w in d.weights) or sum(d.weights) <= 0:
            return "weights must be finite, non-negative and not all zero"
        for i in d.instances:
            problem = self._live(i, d.agent_type)
            if problem:
                return problem
        return None

    def _migrate(self, d: Migrate) -> str | None:
        src = self.view.instance(d.source)
        if src is None:
            return f"unknown instance {d.source!r}"
        if d.source == d.destination:
            return "source and destination are the same instance"
        if self.view.directives(src.agent_type).stateful:
            return f"{src.agent_type} is stateful: its sessions are never migrated"
        return self._live(d.destination, src.agent_type)

    def _holds_state_of(self, instance_id: str) -> str | None:
        """A session whose route leads to the instance: its state is there. A session
        migrated in this step still counts: the cluster may refuse the move (its state
        still on its way from an earlier one), and then the kill."""
        routed = {**self.view.rules.routes, **self.routes}
        return min((s for (s, _), i in routed.items() if i == instance_id), default=None)

    def _alive_count(self, agent_type: str, starting: bool = False) -> int:
        now = self.view.provisioned(agent_type) if starting else \
            self.view.instances_of(agent_type)
        return len(now) + self.alive_delta.get(agent_type, 0)

    def _kill(self, d: Kill) -> str | None:
        inst = self.view.instance(d.instance_id)
        if inst is None or not inst.alive or d.instance_id in self.killed:
            return f"instance {d.instance_id!r} is not alive"
        floor = self.view.directives(inst.agent_type).min_instances
        if self._alive_count(inst.agent_type) - 1 < max(1, floor):
            return f"{inst.agent_type} would go below min_instances ({max(1, floor)})"
        if d.instance_id in self.view.rules.pins.values():
            return f"{d.instance_id} holds a stateful session"
        session = self._holds_state_of(d.instance_id)
        if session is not None:  # as the cluster refuses it
            return f"{d.instance_id} holds the state of session {session}: migrate it first"
        self.killed.add(d.instance_id)
        self._count(inst.agent_type, -1)
        return None

    def _provision(self, d: Provision) -> str | None:
        if d.agent_type not in self.view.agents:
            return f"unknown agent type {d.agent_type!r}"
        ceiling = self.view.directives(d.agent_type).max_instances
        if self._alive_count(d.agent_type, starting=True) + 1 > ceiling:
            return f"{d.agent_type} is at max_instances ({ceiling})"
        pool = self.view.pool_of(d.agent_type)
        capacity = self.view.capacity.get(pool)
        if capacity is not None:
            problem = shortfall(d.agent_type, self.view.directives(d.agent_type).resources,
                                self._reserved(pool), capacity)
            if problem is not None:
                return problem
        self._count(d.agent_type, 1)
        return None

    def _count(self, agent_type: str, delta: int) -> None:
        """One instance more (1) or fewer (-1) as of this step, and its reservation."""
        self.alive_delta[agent_type] = self.alive_delta.get(agent_type, 0) + delta
        self._reserve(agent_type, float(delta))

    def _reserved(self, pool: str) -> dict[str, float]:
        held = self.reserved.get(pool)
        if held is None:
            held = self.reserved[pool] = self.view.reserved(pool)
        return held

    def _reserve(self, agent_type: str, sign: float) -> None:
        pool = self.view.pool_of(agent_type)
        if pool in self.view.capacity:
            self.reserved[pool] = plus(self._reserved(pool),
                                       self.view.directives(agent_type).resources, sign)


# --- decisions as plain data (the daemon sends them to sandboxes as JSON) ------------

DECISIONS: dict[str, type] = {t.__name__: t for t in (Route, WeightedRoute, SetPriority,
                                                         Migrate, Kill, Provision)}


def decision_to_dict(d: ControlDecision) -> dict[str, Any]:
    out: dict[str, Any] = {"kind": type(d).__name__}
    for k, v in vars(d).items():
        out[k] = list(v) if isinstance(v, tuple) else v
    return out


def decision_from_dict(data: Mapping[str, Any]) -> ControlDecision:
    """The inverse of `decision_to_dict`; ValueError names what does not fit."""
    kind = data.get("kind")
    cls = DECISIONS.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise ValueError(f"decision kind must be one of {sorted(DECISIONS)}, got {kind!r}")
    fields = {k: v for k, v in data.items() if k != "kind"}
    for k in ("instances", "weights"):
        if isinstance(fields.get(k), list):
            fields[k] = tuple(fields[k])
    known = {f.name: str(f.type) for f in dataclasses.fields(cls)}
    for name, value in fields.items():
        if name not in known:
            raise ValueError(f"{kind} has no field {name!r}; known: {', '.join(known)}")
        if not _fits(known[name], value):
            raise ValueError(f"{kind}.{name} must be {known[name]}, got {value!r}")
    try:
        decision: ControlDecision = cls(**fields)
    except TypeError as exc:
        raise ValueError(f"{kind}: {exc}") from None
    return decision


def _fits(annotation: str, value: Any) -> bool:
    if value is None:
        return annotation.endswith("| None")
    base = annotation.removesuffix(" | None")
    if base == "str":
        return isinstance(value, str)
    if base == "float":
        return isinstance(value, int | float) and not isinstance(value, bool)
    if base.startswith("tuple["):
        item = "str" if "str" in base else "float"
        return isinstance(value, tuple) and all(_fits(item, v) for v in value)
    return False
