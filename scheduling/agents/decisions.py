"""Installing the global controller's decisions (scheduling/agents/policy.py) into the
cluster: route, weighted route and set_priority go into the rule table (re-keying the
session's queued calls), migrate moves a call or a whole session with its state, kill
drains an instance, provision adds one (STARTING under `cold_start`). Each is checked
by the Validator against a brief view first, and traced as `control.applied`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from scheduling.agents.messages import MigrateRequest, MigrateSession
from scheduling.agents.parking import Parking
from scheduling.agents.policy import (
    ControlDecision,
    ControlView,
    FutureStatus,
    InstanceState,
    InstanceView,
    Kill,
    Migrate,
    Route,
    SetPriority,
    Validator,
    WeightedRoute,
    decision_to_dict,
)
from scheduling.agents.resources import NoCapacity


@dataclass(frozen=True)
class Applied:
    """A decision and whether it was installed (`detail`: why not)."""

    decision: ControlDecision
    ok: bool
    detail: str = ""


class Decisions(Parking):
    """A layer of `Cluster` (cluster.py)."""

    def __init__(self, cold_start: bool) -> None:
        """`cold_start`: a provisioned instance is STARTING (holding its resources, not
        serving) until the host calls `activate`, as when it loads a model."""
        self.cold_start = cold_start

    def brief_view(self) -> ControlView:
        """Instances without their calls: enough to validate a decision."""
        instances = [InstanceView(c.id, c.agent_type, c.node, c.state_, c.slots,
                                  running=len(c.running))
                     for cs in self.by_type.values() for c in cs]
        return ControlView((), instances, self.agents, self.rules.snapshot(),
                           capacity=self._capacity())

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
