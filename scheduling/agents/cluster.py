"""An in-process host for local controllers: placement, message transport, and the
installation of global decisions. The sandbox runtime, the benchmark and the tests
use it; it is pure (the caller passes `now`, and runs the calls `start_next` returns).

Placement of a new call (the event-driven half of routing), in order:
a stateful agent's session pin; the session's installed route; the agent type's
weighted route; else the least-loaded live instance, growing the type up to its
`max_instances` when `grow_on_demand` and no instance is idle. A weighted route
picks the usable instance with the least load per unit of weight.

With a `capacity` (the run's, control_resources.py) every instance reserves its type's
`resources` from it while provisioned: a provision, a `min_instances` start-up or an
on-demand growth that does not fit is refused (growth then uses the instances there
are), and a kill gives the reservation back. A batchable agent's instances run up to
`max_batch` calls at once (their slots); others one. With a `resource_wait_s`, a call
to a type with no live instance and no room for one waits in the waiting room
(control_waiting.py) until room frees, or fails after that long; without, it is refused.
Room goes first come first served across types among the calls ready to run (one whose
dependency still runs holds no one back); a waiting call whose dependency failed fails
at once; views show waiting calls with no executor.

Per call the work is a fixed number of dict operations and one heap operation,
whatever the number of live calls: least-loaded comes from a load index kept as calls
come and go (scheduling/agents/load.py), and a session's records are indexed by
session so that forgetting one reads only its own.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from scheduling.agents.load import LoadIndex
from scheduling.agents.local import LocalController, Started
from scheduling.agents.messages import (
    AddConsumer,
    Message,
    MigrateRequest,
    MigrateSession,
    Submit,
    Transfer,
)
from scheduling.agents.policy import (
    DRIVER,
    ControlDecision,
    ControlView,
    Directives,
    FutureStatus,
    FutureView,
    InstanceState,
    InstanceView,
    Kill,
    Migrate,
    Route,
    SessionView,
    SetPriority,
    Validator,
    WeightedRoute,
    decision_to_dict,
)
from scheduling.agents.resources import (
    NoCapacity,
    Resources,
    Short,
    describe,
    never_fits,
    plus,
    short_of,
    shortfall,
)
from scheduling.agents.rules import RuleTable
from scheduling.agents.waiting import WAITING_ROOM, WaitingRoom

EXTERNAL = "external"  # holds calls the controllers do not run (tools), until they finish
FOLD_AT = 4096  # session counts waiting for a view; past this the call that adds one folds


@dataclass(frozen=True)
class Applied:
    decision: ControlDecision
    ok: bool
    detail: str = ""


class Cluster:
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
        self.rules = RuleTable()
        self.capacity = None if capacity is None else dict(capacity)
        self.reserved: dict[str, float] = {}
        self._holds: dict[str, Resources] = {}  # provisioned instance -> its reservation
        self.agents: dict[str, Directives] = dict(agents or {})
        self.grow_on_demand = grow_on_demand
        self.auto_pump = auto_pump
        self.record_events = record_events
        self.cold_start = cold_start
        self.controllers: dict[str, LocalController] = {
            name: LocalController(name, "", self.rules, executes=False)
            for name in (DRIVER, EXTERNAL)}
        self.room: WaitingRoom | None = None
        self._dependency_failed: list[tuple[str, str]] = []  # (waiting call, failed dependency)
        if resource_wait_s is not None and resource_wait_s > 0:
            self.room = WaitingRoom(self.rules, resource_wait_s)
            self.controllers[WAITING_ROOM] = self.room.hold
        self.by_type: dict[str, list[LocalController]] = {}
        self.outbox: deque[Message] = deque()
        self.events: list[dict[str, Any]] = []
        self._seq = 0
        self._numbers: dict[str, int] = {}
        self._index: dict[str, LoadIndex] = {}  # agent type -> its ACTIVE instances by load
        self._turns: dict[str, dict[str, int]] = {}  # session -> agent type -> next turn
        self._attempts: dict[str, dict[str, int]] = {}  # session -> call key -> calls
        self._meta: dict[str, _Meta] = {}
        self._calls: dict[str, list[str]] = {}  # session -> its calls, for forgetting it
        self._visited: dict[str, set[str]] = {}  # session -> instances migration took it to
        self._tally: dict[str, _Tally] = {}  # live agent calls per session
        # (tally, stage, attempt, +1 or -1) not folded into the tallies yet: only views
        # read them, so the per-call path appends and the global loop folds
        self._counted: list[tuple[_Tally, int, int, int]] = []
        self._sessions: dict[str, SessionView] = {}  # the tallies as the view shows them
        self._stale: set[str] = set()  # sessions whose SessionView is out of date

    # --- instances ----------------------------------------------------------------------

    def add_agent(self, agent_type: str, directives: Directives) -> None:
        self.agents[agent_type] = directives

    def add_instance(self, agent_type: str, instance_id: str | None = None, *,
                     node: str = "local", slots: int | None = None, reason: str = "",
                     starting: bool = False, now: float | None = None) -> LocalController:
        """NoCapacity: its reservation does not fit (nothing is added)."""
        directives = self.agents.setdefault(agent_type, Directives())
        problem = self.room_for(agent_type)
        if problem is not None:
            raise NoCapacity(problem)
        if slots is None:
            slots = max(1, directives.max_batch) if directives.batchable else 1
        if instance_id is None:
            n = self._numbers.get(agent_type, 0)
            self._numbers[agent_type] = n + 1
            instance_id = f"{agent_type}#{n}"
        if instance_id in self.controllers:
            raise ValueError(f"instance {instance_id!r} exists")
        c = LocalController(instance_id, agent_type, self.rules, node=node, slots=slots,
                            stateful=directives.stateful, now=now)
        self.controllers[instance_id] = c
        self.by_type.setdefault(agent_type, []).append(c)
        if directives.resources:
            self._holds[instance_id] = directives.resources
            self.reserved = plus(self.reserved, directives.resources)
        self._set_state(c, InstanceState.STARTING if starting else InstanceState.ACTIVE)
        self._event("instance.provisioned", instance=instance_id, agent_type=agent_type,
                    node=node, reason=reason)
        return c

    def room_for(self, agent_type: str) -> str | None:
        """Why one more instance of the type does not fit the capacity (None: it does)."""
        if self.capacity is None:
            return None
        need = self.agents.get(agent_type, Directives()).resources
        return shortfall(agent_type, need, self.reserved, self.capacity) if need else None

    def provision_startup(self, agent_type: str, n: int, now: float | None = None) -> int:
        """The type's `min_instances` at registration; the first that does not fit is
        refused as a `control.applied` event and ends the start-up. Returns how many
        were added."""
        for added in range(n):
            problem = self.room_for(agent_type)
            if problem is not None:
                self._event("control.applied", decision="Provision", ok=False, detail=problem,
                            agent_type=agent_type, node=None, reason="min_instances")
                return added
            self.add_instance(agent_type, reason="min_instances", now=now)
        return n

    def _release(self, instance_id: str) -> None:
        held = self._holds.pop(instance_id, None)
        if held is not None:
            self.reserved = plus(self.reserved, held, -1.0)

    def activate(self, instance_id: str, now: float | None = None) -> None:
        """A STARTING instance is ready to serve (and takes the calls waiting for one,
        given `now`)."""
        c = self.controllers[instance_id]
        if c.state_ is InstanceState.STARTING:
            self._set_state(c, InstanceState.ACTIVE)
            self._event("instance.active", instance=instance_id)
            if now is not None:
                self.unpark(now)

    def _set_state(self, c: LocalController, state: InstanceState) -> None:
        """The one place an instance changes state: only ACTIVE ones are in the index."""
        c.state_ = state
        index = self._index.get(c.agent_type)
        if index is None:
            index = self._index[c.agent_type] = LoadIndex()
        if state is InstanceState.ACTIVE:
            index.add(c.id, len(c.held))
            c.index = index
        else:
            index.remove(c.id)
            c.index = None

    def alive(self, agent_type: str) -> list[LocalController]:
        return [c for c in self.by_type.get(agent_type, ()) if c.state_ is InstanceState.ACTIVE]

    def _load(self, instance_id: str) -> int:
        return self.controllers[instance_id].load

    def _usable(self, instance_id: str) -> bool:
        c = self.controllers.get(instance_id)
        return c is not None and c.state_ is InstanceState.ACTIVE

    # --- placement and creation (the per-call path) -----------------------------------

    def place(self, agent_type: str, session_id: str) -> tuple[str, str]:
        return self._place(agent_type, session_id, self.agents[agent_type])

    def _place(self, agent_type: str, session_id: str, directives: Directives,
               grow: bool = True) -> tuple[str, str]:
        """`grow` False: on an instance there is, never on a new one."""
        rules = self.rules
        if directives.stateful:
            key = (session_id, agent_type)
            pinned = rules.pins.get(key)
            if pinned is not None and self._usable(pinned):
                return pinned, "stateful session pin"
            chosen = self._least_loaded(agent_type, directives, grow)
            rules.pin(session_id, agent_type, chosen)
            return chosen, "stateful: pinned to the least loaded"
        if rules.routes:
            routed = rules.routes.get((session_id, agent_type))
            if routed is not None and self._usable(routed):
                return routed, "session route"
        if agent_type in rules.weights:
            weighted = rules.weighted(agent_type, self._usable, self._load)
            if weighted is not None:
                return weighted, "weighted route"
        return self._least_loaded(agent_type, directives, grow), "least loaded"

    def _least_loaded(self, agent_type: str, directives: Directives, grow: bool = True) -> str:
        index = self._index.get(agent_type)
        least = index.least() if index is not None else None
        if grow and (least is None or (least[1] > 0 and self.grow_on_demand
                                       and len(index or ()) < directives.max_instances)):
            problem = self.room_for(agent_type)
            if problem is None:
                return self.add_instance(agent_type, reason="on demand").id
            if least is None:
                raise NoCapacity(f"no live instance of {agent_type} and none can start: "
                                 f"{problem}")
        if least is None:
            raise NoCapacity(f"no live instance of {agent_type}, and calls of other agents "
                             f"have waited longer for room")
        return least[0]

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
            attempt = _bump(self._attempts, session_id, call_key)
        # a waiting call takes its turn when it leaves: one that fails waiting leaves no gap
        turn = _bump(self._turns, session_id, agent_type) \
            if directives.stateful and instance != WAITING_ROOM else None
        self._seq += 1
        view = _future(fid, session_id, agent_type, instance, now, self._seq, creator,
                       tuple(deps), stage, attempt, turn)
        meta[fid] = tuple.__new__(_Meta, (session_id, stage, instance, attempt, creator))
        calls = self._calls.get(session_id)
        if calls is None:
            self._calls[session_id] = [fid]
        else:
            calls.append(fid)
        tally = self._tally.get(session_id)
        if tally is None:
            tally = self._tally[session_id] = _Tally(session_id)
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

    def _locate(self, creator: str, dep: str) -> str:
        known = self.controllers[creator].directory.get(dep) if creator in self.controllers \
            else None
        if known is not None:
            return known
        meta = self._meta.get(dep)
        return meta.placed if meta is not None else EXTERNAL

    def knows(self, fid: str) -> bool:
        return fid in self._meta

    def external(self, fid: str, session_id: str, now: float) -> None:
        """A call the controllers do not run (a tool): its value comes from `complete`."""
        self._meta[fid] = _Meta(session_id, 0, EXTERNAL, 0, DRIVER)
        self._calls.setdefault(session_id, []).append(fid)
        view = FutureView(fid, session_id, "", EXTERNAL, FutureStatus.RUNNING, now,
                          creator=DRIVER)
        self.send(self.controllers[EXTERNAL].hold_running(view, now), now)

    def complete(self, fid: str, value: object, ok: bool, now: float) -> None:
        self.send(self.controllers[EXTERNAL].finish(fid, value, ok, now), now)

    # --- waiting for room (control_waiting.py) ---------------------------------------------

    def _place_or_wait(self, agent_type: str, session_id: str, directives: Directives,
                       now: float) -> tuple[str, str]:
        """`_place`, or the waiting room when the type has no instance and no room for
        one, but one could fit the capacity. Calls already waiting go first: the
        type's own, and any other type's ready one for room (a new instance waits for
        them). NoCapacity: one instance never fits."""
        room = self.room
        assert room is not None
        grow = True
        if not room.empty():
            self.unpark(now)
            if room.queued(agent_type):
                return WAITING_ROOM, "behind earlier calls waiting for resources"
            grow = not room.holding_back()
        try:
            return self._place(agent_type, session_id, directives, grow=grow)
        except NoCapacity:
            if self.capacity is None or never_fits(agent_type, directives.resources,
                                                   self.capacity) is not None:
                raise
            return WAITING_ROOM, "waiting for resources"

    def _park(self, fid: str, session_id: str, agent_type: str, seq: int) -> None:
        assert self.room is not None and self.capacity is not None
        ahead = [t for t in self.room.holding_back() if t != agent_type]
        self.room.park(agent_type, seq, fid)
        need = self.agents[agent_type].resources
        fields = _short_fields(agent_type, short_of(need, self.reserved, self.capacity))
        if fields["resource"] is None and ahead:
            fields["reason"] = (f"{agent_type}'s instance fits, but calls of "
                                f"{', '.join(ahead)} have waited longer for room")
        self._event("future.waiting", id=fid, session_id=session_id, agent_type=agent_type,
                    wait_s=self.room.wait_s, **fields)

    def unpark(self, now: float) -> None:
        """Place the waiting calls that now have room, oldest first across types. Once
        a type finds no room, the calls of other types younger than its oldest ready
        call go only where their type has an instance: room goes first come first
        served among ready calls. A call becoming ready needs no `unpark`: it only
        holds more calls back."""
        room = self.room
        if room is None:
            return
        blocked: set[str] = set()
        bar = math.inf  # creation order of the oldest ready call left without room
        while (agent_type := room.next_type(blocked)) is not None:
            view = room.head(agent_type)  # None: its Submit is on its way; it keeps its turn
            directives = self.agents[agent_type]
            placed = None if view is None else \
                self._try_place(agent_type, view.session_id, directives, grow=view.seq < bar)
            if view is None or placed is None:
                blocked.add(agent_type)
                first = room.first_ready(agent_type)
                if first is not None:
                    bar = min(bar, first)
                continue
            target, how = placed
            room.leave(agent_type)
            if directives.stateful:
                room.set_turn(view.future_id, _bump(self._turns, view.session_id, agent_type))
            self._event("future.placed", id=view.future_id, session_id=view.session_id,
                        agent_type=agent_type, instance=target,
                        reason=f"{how}, after {now - view.created_at:.1f} s waiting "
                               f"for resources",
                        stage=view.stage, attempt=view.attempt)
            self.send((MigrateRequest(WAITING_ROOM, view.future_id, target),), now)

    def _try_place(self, agent_type: str, session_id: str, directives: Directives,
                   grow: bool) -> tuple[str, str] | None:
        try:
            return self._place(agent_type, session_id, directives, grow)
        except NoCapacity:
            return None

    def expire(self, now: float) -> list[tuple[str, str]]:
        """End the waits that ran out: each call ready for `resource_wait_s` with still
        no room fails (its consumers and creator get the failure). Returns (call, why)
        for each failed now; with `auto_pump` off, a call fails once its move arrives."""
        room = self.room
        if room is None:
            return []
        self.unpark(now)
        due = room.due(now)
        for agent_type, view in due:
            short = short_of(self.agents[agent_type].resources, self.reserved,
                             self.capacity or {})
            fields = _short_fields(agent_type, short)
            room.expiring[view.future_id] = (
                f"agent {agent_type} waited {room.wait_s:g} s for resources and none "
                f"freed: {fields['reason']}")
            self._event("future.wait_expired", id=view.future_id, session_id=view.session_id,
                        agent_type=agent_type, waited_s=now - view.created_at, **fields)
            sink = room.sink(agent_type)
            self.controllers.setdefault(sink.id, sink)
            self.send((MigrateRequest(WAITING_ROOM, view.future_id, sink.id),), now)
        failed: list[tuple[str, str]] = []
        for sink in room.sinks.values():
            while (started := sink.start_next(now)) is not None:
                fid = started.future.future_id
                self.finish(sink.id, fid, None, False, now)
                failed.append((fid, room.expiring.pop(fid)))
        if due:
            self.unpark(now)  # the calls that held the room back are gone
        return failed

    def _failed_waiting(self, now: float) -> None:
        """Calls the room ended at once, their dependency failed (control_waiting.py):
        out of the queues and the tallies, into `take_dependency_failures`."""
        room = self.room
        assert room is not None
        for view, dep in room.hold.failed:
            room.drop(view.agent_type, view.future_id)
            meta = self._meta.get(view.future_id)
            tally = self._tally.get(view.session_id)
            if meta is not None and tally is not None:
                self._count(tally, meta.stage, meta.attempt, -1)
            self._event("future.dependency_failed", id=view.future_id,
                        session_id=view.session_id, agent_type=view.agent_type,
                        dependency=dep, reason="failed while waiting for resources")
            self._dependency_failed.append((view.future_id, dep))
        room.hold.failed.clear()
        self.unpark(now)  # one of them may have held the room back

    def take_dependency_failures(self) -> list[tuple[str, str]]:
        """(call, its failed dependency) for each waiting call failed since the last
        take: the host fails each as it fails a call that ran with a failed dependency."""
        failed, self._dependency_failed = self._dependency_failed, []
        return failed

    def waiting(self) -> int:
        """Calls in the waiting room (and on their way to fail)."""
        return 0 if self.room is None else len(self.room)

    def next_deadline(self) -> float | None:
        """When `expire` next has a wait to end (None: no waiting call is ready yet)."""
        return None if self.room is None else self.room.next_deadline()

    # --- running ------------------------------------------------------------------------

    def start_next(self, instance_id: str, now: float) -> Started | None:
        started = self.controllers[instance_id].start_next(now)
        if started is not None and self.record_events:
            self._event("future.started", id=started.future.future_id, instance=instance_id,
                        session_id=started.future.session_id)
        return started

    def startable(self) -> list[str]:
        return [c.id for cs in self.by_type.values() for c in cs if c.has_startable()]

    def finish(self, instance_id: str, fid: str, value: object, ok: bool, now: float) -> None:
        c = self.controllers[instance_id]
        out = c.finish(fid, value, ok, now)
        if len(out) == 1:
            self._send_one(out[0], now)  # the value to its creator alone: the common case
        else:
            self.send(out, now)
        meta = self._meta.get(fid)
        if meta is not None:
            tally = self._tally.get(meta.session)
            if tally is not None:
                self._count(tally, meta.stage, meta.attempt, -1)
        if c.state_ is InstanceState.DRAINING:
            self._reap(c)

    # --- transport ----------------------------------------------------------------------

    def send(self, messages: Iterable[Message], now: float) -> None:
        self.outbox.extend(messages)
        if self.auto_pump:
            self.pump(now)

    def _send_one(self, m: Message, now: float) -> None:
        """`send` of one message, without the queue when nothing is ahead of it."""
        if self.auto_pump and not self.outbox:
            self.deliver(m, now)
            if self.outbox:
                self.pump(now)
        else:
            self.send((m,), now)

    def pump(self, now: float) -> None:
        while self.outbox:
            self.deliver(self.outbox.popleft(), now)

    def deliver(self, m: Message, now: float) -> None:
        c = self.controllers[m.to]
        out = c.handle(m, now)
        if not out and not c.refused and c.state_ is InstanceState.ACTIVE:
            return  # the common case, kept short: nothing to log, forward or reap
        self._settle(c, out, m, now)

    def _settle(self, c: LocalController, out: list[Message], m: Message, now: float) -> None:
        """After `c` handled `m`: log migrations and refusals, pass on what a killed
        instance was sent, queue `out`, end the waits of calls whose dependency failed."""
        for o in out:
            if isinstance(o, Transfer):
                self._visit(o.future.session_id, o.to)
                if c.id != WAITING_ROOM:  # leaving it is a placement, traced as one
                    self._event("future.migrated", id=o.future.future_id, source=c.id,
                                destination=o.to, session_id=o.future.session_id)
        while c.refused:
            fid, why = c.refused.pop()
            self._event("migration.refused", id=fid, instance=c.id, reason=why)
        if c.state_ is not InstanceState.ACTIVE and isinstance(m, Submit | Transfer) \
                and m.future.future_id in c.held and self.alive(c.agent_type):
            # placed or moved here before the kill: pass it on to a live instance
            target = self.place(c.agent_type, m.future.session_id)[0]
            out.append(MigrateRequest(c.id, m.future.future_id, target))
        self.outbox.extend(out)
        self._reap(c)
        if self.room is not None and c is self.room.hold and self.room.hold.failed:
            self._failed_waiting(now)

    def deliver_at(self, index: int, now: float) -> None:
        """Deliver the index-th message in flight (tests: any delivery order)."""
        m = self.outbox[index]
        del self.outbox[index]
        self.deliver(m, now)

    # --- installing decisions -------------------------------------------------------------

    def apply(self, decisions: Iterable[ControlDecision], now: float,
              validate: bool = True) -> list[Applied]:
        checker = Validator(self.brief_view()) if validate else None
        done: list[Applied] = []
        reorder: set[str] = set()
        for d in decisions:
            problem = checker.check(d) if checker is not None else None
            if problem is None:
                problem = self._apply_one(d, now, reorder)
            done.append(Applied(d, problem is None, problem or ""))
            fields = decision_to_dict(d)
            self._event("control.applied", decision=fields.pop("kind"), ok=problem is None,
                        detail=problem or "", **fields)
        for session in reorder:
            self._rekey(session)
        if self.room is not None:
            self.unpark(now)  # a kill or a provision may have made room
        return done

    def _rekey(self, session_id: str) -> None:
        """Re-key the session's queued calls where they are: where each was placed,
        or where the forwarding pointers left behind by its migrations lead. A call
        still in flight is keyed when it arrives."""
        controllers = self.controllers
        for fid in self._calls.get(session_id, ()):
            meta = self._meta.get(fid)
            c = controllers.get(meta.placed) if meta is not None else None
            for _ in controllers:  # pointers can loop while a call is on its way back
                if c is None or c.rekey(fid):
                    break
                moved = c.moved.get(fid)
                c = controllers.get(moved[0]) if moved is not None else None

    def _apply_one(self, d: ControlDecision, now: float, reorder: set[str]) -> str | None:
        # `now` also dates a provisioned instance's utilisation history
        if isinstance(d, Route | WeightedRoute | SetPriority):
            session = self.rules.install(d)
            if session is not None:
                reorder.add(session)
            return None
        if isinstance(d, Migrate):
            return self._migrate(d, now)
        if isinstance(d, Kill):
            return self._kill(d, now)
        try:
            self.add_instance(d.agent_type, node=d.node or "local",
                              reason=d.reason or "provision", starting=self.cold_start, now=now)
        except NoCapacity as exc:
            return str(exc)
        return None

    def _migrate(self, d: Migrate, now: float) -> str | None:
        src = self.controllers[d.source]
        key = (d.session_id, src.agent_type)
        holder = self.rules.routes.get(key)
        if d.future_id is not None:
            if holder is not None:
                return f"session {d.session_id} keeps its state on {holder}: move it whole"
            self.send([MigrateRequest(d.source, d.future_id, d.destination)], now)
            return None
        if holder is not None and holder != d.source:
            return f"session {d.session_id}'s state is on {holder}, not {d.source}"
        if any(c.expecting(key) for c in self.by_type.get(src.agent_type, ())):
            return "this session's state is still moving from an earlier migration"
        with_state = holder is not None or key in src.state
        self._visit(d.session_id, d.source)  # it records the departure
        if with_state:
            if holder is not None:
                self.rules.routes[key] = d.destination
            self.controllers[d.destination].expect(key)
            self._visit(d.session_id, d.destination)
        self.send([MigrateSession(d.source, d.session_id, src.agent_type, d.destination,
                                  with_state)], now)
        return None

    def _kill(self, d: Kill, now: float) -> str | None:
        """Drain: no new calls; queued calls move to live instances; dies when empty.
        An instance holding a session's state is refused: migrate the session first."""
        c = self.controllers[d.instance_id]
        routed = {s for (s, t), i in self.rules.routes.items() if i == c.id}
        routed |= {s for (s, _) in c.state}
        if routed:
            return f"{c.id} holds the state of session {min(routed)}: migrate it first"
        self._set_state(c, InstanceState.DRAINING)
        self._release(c.id)
        self.rules.forget_instance(c.id)
        self._event("instance.killed", instance=c.id, reason=d.reason)
        movable = [h.view for h in c.held.values()
                   if h.view.status in (FutureStatus.WAITING, FutureStatus.QUEUED)]
        if movable and self.alive(c.agent_type):
            self.send([MigrateRequest(c.id, v.future_id, self.place(c.agent_type, v.session_id)[0])
                       for v in movable], now)
        self._reap(c)
        return None

    def _reap(self, c: LocalController) -> None:
        if c.state_ is InstanceState.DRAINING and not c.held:
            self._set_state(c, InstanceState.DEAD)
            self.by_type[c.agent_type].remove(c)
            self._event("instance.dead", instance=c.id)

    # --- views --------------------------------------------------------------------------

    def view(self, now: float | None = None) -> ControlView:
        """Every live call, those waiting for room with no executor."""
        futures: list[FutureView] = []
        instances = [c.snapshot(futures, now) for cs in self.by_type.values() for c in cs]
        if self.room is not None:
            futures += self.room.waiting()
        return ControlView(futures, instances, self.agents, self.rules.snapshot(),
                           self._session_views().values(), self._capacity())

    def brief_view(self) -> ControlView:
        """Instances without their calls: enough to validate a decision."""
        instances = [InstanceView(c.id, c.agent_type, c.node, c.state_, c.slots,
                                  running=len(c.running))
                     for cs in self.by_type.values() for c in cs]
        return ControlView((), instances, self.agents, self.rules.snapshot(),
                           capacity=self._capacity())

    def _capacity(self) -> dict[str, Resources] | None:
        return None if self.capacity is None else {"": self.capacity}

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

    def _visit(self, session_id: str, instance_id: str) -> None:
        self._visited.setdefault(session_id, set()).add(instance_id)

    def _count(self, tally: _Tally, stage: int, attempt: int, delta: int) -> None:
        """Count a call in (delta 1) or out (-1) of its session's tally, later."""
        counted = self._counted
        counted.append((tally, stage, attempt, delta))
        if len(counted) >= FOLD_AT:  # no view for a while: keep the backlog bounded
            self._fold()

    def _fold(self) -> None:
        """Apply the counts in order. A forgotten session's tally is no longer in
        `_tally`: counting into it changes nothing anyone reads."""
        stale = self._stale
        for t, stage, attempt, delta in self._counted:
            t.live += delta
            stages, attempts = t.stages, t.attempts
            n = stages.get(stage, 0) + delta
            if n:
                stages[stage] = n
            else:
                del stages[stage]
            n = attempts.get(attempt, 0) + delta
            if n:
                attempts[attempt] = n
            else:
                del attempts[attempt]
            stale.add(t.session)
        self._counted.clear()

    def set_state_cost(self, session_id: str, state_s: float) -> None:
        """The host's estimate of rebuilding the session's state on another instance
        (its KV recomputed, say), in seconds: views show it as `SessionView.state_s`
        while the session has live calls, until it changes or the session is forgotten.
        ValueError: not a finite number >= 0."""
        if not math.isfinite(state_s) or state_s < 0:
            raise ValueError(f"state_s must be a finite number >= 0, got {state_s!r}")
        tally = self._tally.get(session_id)
        if tally is None:
            tally = self._tally[session_id] = _Tally(session_id)
        if tally.state_s != state_s:
            tally.state_s = state_s
            self._stale.add(session_id)

    def _session_views(self) -> dict[str, SessionView]:
        self._fold()
        for s in self._stale:
            t = self._tally.get(s)
            if t is not None and t.live:
                self._sessions[s] = SessionView(s, t.live, max(t.stages), max(t.attempts),
                                                t.state_s)
            else:
                self._sessions.pop(s, None)
        self._stale.clear()
        return self._sessions

    def _event(self, kind: str, **data: Any) -> None:
        if self.record_events:
            self.events.append({"event": kind, **data})

    def take_events(self) -> list[dict[str, Any]]:
        events, self.events = self.events, []
        return events


class _Meta(NamedTuple):
    session: str
    stage: int
    placed: str  # the instance it was placed on (it may have moved since)
    attempt: int
    creator: str


def _short_fields(agent_type: str, short: Short | None) -> dict[str, Any]:
    """A waiting call's trace fields: the resource it lacks, needed vs free."""
    if short is None:  # room freed since: it is placed at the next `unpark`
        return {"resource": None, "reason": f"{agent_type}'s instance fits again"}
    return {"resource": short.key, "need": short.need, "free": short.free,
            "capacity": short.have, "reason": describe(agent_type, short)}


def _bump(table: dict[str, dict[str, int]], session_id: str, key: str) -> int:
    """The session's count under `key` before this call, counting this one."""
    mine = table.get(session_id)
    if mine is None:
        table[session_id] = {key: 1}
        return 0
    n = mine.get(key, 0)
    mine[key] = n + 1
    return n


def _future(fid: str, session_id: str, agent_type: str, instance: str, now: float, seq: int,
            creator: str, deps: tuple[str, ...], stage: int, attempt: int,
            turn: int | None) -> FutureView:
    """A new call's view, built positionally: NamedTuple's keyword-checking constructor
    costs several times more on the per-call path."""
    return tuple.__new__(FutureView, (fid, session_id, agent_type, instance,
                                      FutureStatus.WAITING, now, seq, creator, deps, (), stage,
                                      attempt, turn, None, None, 0))


class _Tally:
    """Live calls of one session, counted per stage and per attempt."""

    __slots__ = ("attempts", "live", "session", "stages", "state_s")

    def __init__(self, session: str) -> None:
        self.session = session
        self.live = 0
        self.state_s = 0.0  # set_state_cost's, kept with the tally: forgotten with it
        self.stages: dict[int, int] = {}
        self.attempts: dict[int, int] = {}
