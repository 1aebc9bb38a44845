"""An in-process host for local controllers: the cluster of agent instances that NALAR's
two-level control runs on. The sandbox runtime, the benchmark and the tests use it; it
is pure (the caller passes `now`, and runs the calls `start_next` returns).

`Cluster` is the facade; each of its jobs is a layer in a module of its own, each
building on the ones before it:

  accounting.py  records of each session's calls, the tallies views show, trace events
  instances.py   the registry of instances, their reservations and lifecycle
  placement.py   where a new call runs: pins, routes, weighted routes, least loaded
  delivery.py    messages between the local controllers; starting and finishing calls
  parking.py     calls waiting in the waiting room for room for an instance
  decisions.py   installing the global controller's decisions
  cluster.py     creating calls (the per-call path), the view, forgetting a session

The layers are classes that build one object (each on the one before it), not objects
that hold each other: they share its state, so the per-call path reads it with no hop
between objects, and its cost stays what it was before the split.

With a `capacity` (the run's, scheduling/agents/resources.py) every instance reserves
its type's `resources` from it while provisioned: a provision, a `min_instances`
start-up or an on-demand growth that does not fit is refused (growth then uses the
instances there are), and a kill gives the reservation back. A batchable agent's
instances run up to `max_batch` calls at once (their slots); others one.

Per call the work is a fixed number of dict operations and one heap operation,
whatever the number of live calls: least-loaded comes from a load index kept as calls
come and go (scheduling/agents/load.py), and a session's records are indexed by
session so that forgetting one reads only its own.
"""

from __future__ import annotations

from collections.abc import Sequence

from scheduling.agents.accounting import FOLD_AT, Accounting, CallMeta, Tally, bump
from scheduling.agents.decisions import Applied, Decisions
from scheduling.agents.delivery import Delivery
from scheduling.agents.instances import EXTERNAL, Instances
from scheduling.agents.messages import AddConsumer, Submit
from scheduling.agents.parking import Parking
from scheduling.agents.placement import Placement
from scheduling.agents.policy import (
    DRIVER,
    ControlView,
    Directives,
    FutureStatus,
    FutureView,
    InstanceState,
)
from scheduling.agents.resources import Resources
from scheduling.agents.waiting import WAITING_ROOM

__all__ = ["EXTERNAL", "FOLD_AT", "Applied", "Cluster"]


class Cluster(Decisions):
    """The cluster's public interface: the layers' methods, and creating calls."""

    def __init__(self, agents: dict[str, Directives] | None = None, *,
                 grow_on_demand: bool = False, auto_pump: bool = True,
                 record_events: bool = True, cold_start: bool = False,
                 capacity: Resources | None = None,
                 resource_wait_s: float | None = None) -> None:
        """`cold_start`: a provisioned instance is STARTING (holding its resources, not
        serving) until the host calls `activate`, as when it loads a model.
        `capacity`: what the instances may reserve in all (None: unbounded).
        `resource_wait_s`: how long a ready call waits for room for an instance of its
        type before it fails (None or <= 0: a call with no room is refused at once);
        the host calls `expire` to end the waits that ran out."""
        # each layer sets only its own state, in this order (the waiting room's
        # controller joins the instances' registry)
        Accounting.__init__(self, record_events)
        Instances.__init__(self, agents, capacity)
        Placement.__init__(self, grow_on_demand)
        Delivery.__init__(self, auto_pump)
        Parking.__init__(self, resource_wait_s)
        Decisions.__init__(self, cold_start)
        self._seq = 0  # creation order of the calls

    def create(self, fid: str, session_id: str, agent_type: str, now: float, *,
               deps: Sequence[str] = (), creator: str = DRIVER, parent: str | None = None,
               call_key: str | None = None, stage: int | None = None) -> str:
        """A new agent call: place it, hand it to its executor, register it as the
        consumer of each dependency. Returns the executor. `stage` defaults to one past
        the deepest of its dependencies and its parent call. NoCapacity: the type has
        no live instance and no room for one (nothing is recorded)."""
        directives = self.agents.get(agent_type)
        if directives is None:
            directives = self.agents[agent_type] = Directives()
        if self.room is None:
            instance, reason = self._place(agent_type, session_id, directives)
        else:
            instance, reason = self._place_or_wait(agent_type, session_id, directives, now)
        meta = self._meta
        if stage is None:
            stages = [meta[d][1] for d in deps if d in meta]
            if parent is not None and parent in meta:
                stages.append(meta[parent][1])
            stage = 1 + max(stages) if stages else 0
        attempt = 0
        if call_key is not None:
            attempt = bump(self._attempts, session_id, call_key)
        # a waiting call takes its turn when it leaves: one that fails waiting leaves no gap
        turn = bump(self._turns, session_id, agent_type) \
            if directives.stateful and instance != WAITING_ROOM else None
        self._seq += 1
        view = _future(fid, session_id, agent_type, instance, now, self._seq, creator,
                       tuple(deps), stage, attempt, turn)
        meta[fid] = tuple.__new__(CallMeta, (session_id, stage, instance, attempt, creator))
        calls = self._calls.get(session_id)
        if calls is None:
            self._calls[session_id] = [fid]
        else:
            calls.append(fid)
        tally = self._tally.get(session_id)
        if tally is None:
            tally = self._tally[session_id] = Tally(session_id)
        self._count(tally, stage, attempt, 1)
        if instance == WAITING_ROOM:
            self._park(fid, session_id, agent_type, self._seq)
        elif self.record_events:
            self._event("future.placed", id=fid, session_id=session_id, agent_type=agent_type,
                        instance=instance, reason=reason, stage=stage, attempt=attempt)
        if not deps:
            c = self.controllers[instance]
            if self.auto_pump and not self.outbox:
                # the Submit message, handed over directly: nothing is in flight ahead of it
                out = c.submit(view, (), now)
                if out or c.refused or c.state_ is not InstanceState.ACTIVE:
                    self._settle(c, out, Submit(instance, view, ()), now)
                    self.pump(now)
            else:
                self.send((Submit(instance, view, ()),), now)
            return instance
        dep_at = tuple((d, self._locate(creator, d)) for d in deps)
        self.send([Submit(instance, view, dep_at),
                   *(AddConsumer(loc, d, fid, instance) for d, loc in dep_at)], now)
        return instance


    def knows(self, fid: str) -> bool:
        return fid in self._meta

    def external(self, fid: str, session_id: str, now: float) -> None:
        """A call the controllers do not run (a tool): its value comes from `complete`."""
        self._meta[fid] = CallMeta(session_id, 0, EXTERNAL, 0, DRIVER)
        self._calls.setdefault(session_id, []).append(fid)
        view = FutureView(fid, session_id, "", EXTERNAL, FutureStatus.RUNNING, now,
                          creator=DRIVER)
        self.send(self.controllers[EXTERNAL].hold_running(view, now), now)

    def complete(self, fid: str, value: object, ok: bool, now: float) -> None:
        self.send(self.controllers[EXTERNAL].finish(fid, value, ok, now), now)

    def view(self, now: float | None = None) -> ControlView:
        """Every live call, those waiting for room with no executor."""
        futures: list[FutureView] = []
        instances = [c.snapshot(futures, now) for cs in self.by_type.values() for c in cs]
        if self.room is not None:
            futures += self.room.waiting()
        return ControlView(futures, instances, self.agents, self.rules.snapshot(),
                           self._session_views().values(), self._capacity())

    def forget_session(self, session_id: str) -> None:
        """The session ended (no live call): drop its rules and records everywhere.
        Reads only the session's own calls and the instances they were on."""
        self.rules.forget_session(session_id)
        creations: dict[str, list[str]] = {}
        for fid in self._calls.pop(session_id, ()):
            meta = self._meta.pop(fid, None)
            if meta is not None:
                creations.setdefault(meta.placed, [])
                creations.setdefault(meta.creator, []).append(fid)
        for inst in self._visited.pop(session_id, ()):
            creations.setdefault(inst, [])
        for inst, created in creations.items():
            c = self.controllers.get(inst)
            if c is not None:
                c.forget_session(session_id, created)
        for table in (self._turns, self._attempts):
            table.pop(session_id, None)
        self._tally.pop(session_id, None)
        self._sessions.pop(session_id, None)
        self._stale.discard(session_id)


def _future(fid: str, session_id: str, agent_type: str, instance: str, now: float, seq: int,
            creator: str, deps: tuple[str, ...], stage: int, attempt: int,
            turn: int | None) -> FutureView:
    """A new call's view, built positionally: NamedTuple's keyword-checking constructor
    costs several times more on the per-call path."""
    return tuple.__new__(FutureView, (fid, session_id, agent_type, instance,
                                      FutureStatus.WAITING, now, seq, creator, deps, (), stage,
                                      attempt, turn, None, None, 0))
