"""Room for agents whose calls wait with no instance (ControlView.waiting_for_room).

Such a call runs nowhere until an instance of its type is provisioned, and fails when
its wait runs out, so it is demand that no load-based rule sees (no instance holds it)
and that outweighs any backlog elsewhere. Types are served in the order the host gives
room (control_waiting.py): those with a call ready to run first, by their oldest
ready call, then the others by their oldest call. Each gets one
instance: provisioned where its pool has room (and the budget, if any, allows), else
after killing the fewest instances of other types that free the resource it lacks,
taken least busy first (running, then held, then recently used), never one that holds
a session's state, and never below a type's max(1, min_instances). A type that cannot
get room that way gets nothing this step: no kill is sent that would not let it fit.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

from scheduling.agents.policy import (
    ControlDecision,
    ControlView,
    FutureStatus,
    FutureView,
    InstanceState,
    InstanceView,
    kill,
    provision,
)
from scheduling.agents.resources import plus, short_of


def make_room(view: ControlView, budget: int | None = None) -> list[ControlDecision]:
    waiting = view.waiting_for_room()
    starved = sorted((t for t in waiting if not view.provisioned(t)),
                     key=lambda t: _turn(waiting[t]))
    if not starved:
        return []
    plan = _Plan(view, budget)
    out: list[ControlDecision] = []
    for t in starved:
        if view.directives(t).max_instances < 1:
            continue
        victims = plan.room_for(t)
        if victims is None:
            continue
        calls = waiting[t]
        why = f"{len(calls)} call(s) of {t} waiting for room"
        out += [kill(v.instance_id, reason=f"room for {t}: {why}") for v in victims]
        out.append(provision(t, reason=why))
    return out


def _turn(calls: list[FutureView]) -> tuple[bool, float]:
    """A type's place for room: a call ready to run holds others back, one whose
    dependency still runs does not (control_waiting.py)."""
    ready = [f.created_at for f in calls if f.status is FutureStatus.QUEUED]
    return (not ready, min(ready, default=calls[0].created_at))


class _Plan:
    """The step's kills and provisions so far, as the validator will count them."""

    def __init__(self, view: ControlView, budget: int | None) -> None:
        self.view = view
        self.budget = budget
        self.in_use = sum(i.state is not InstanceState.DEAD for i in view.instances)
        self.alive = Counter(i.agent_type for i in view.instances if i.alive)
        self.reserved: dict[str, dict[str, float]] = {}
        self.killed: set[str] = set()
        self.keep = set(view.rules.pins.values()) | set(view.rules.routes.values())

    def room_for(self, t: str) -> list[InstanceView] | None:
        """The instances to kill so that one instance of `t` fits (None: no way);
        counts the kills and the provision as done."""
        view, pool = self.view, self.view.pool_of(t)
        need = view.directives(t).resources
        capacity: Mapping[str, float] | None = view.capacity.get(pool)
        reserved = self.reserved.get(pool)
        if reserved is None:
            reserved = view.reserved(pool)
        victims: list[InstanceView] = []
        over = self.budget is not None and self.in_use >= self.budget
        alive = Counter(self.alive)
        for c in self._candidates(t, pool):
            short = short_of(need, reserved, capacity) if capacity is not None else None
            if short is None and not over:
                break
            gives = view.directives(c.agent_type).resources
            floor = max(1, view.directives(c.agent_type).min_instances)
            if alive[c.agent_type] <= floor or (short is not None and gives.get(short.key, 0) <= 0):
                continue
            victims.append(c)
            alive[c.agent_type] -= 1
            reserved = plus(reserved, gives, -1.0)
            over = False  # a kill makes way for the provision within the budget
        if over or (capacity is not None and short_of(need, reserved, capacity) is not None):
            return None
        self.reserved[pool] = plus(reserved, need)
        self.alive = alive
        self.killed |= {v.instance_id for v in victims}
        self.in_use += 1
        return victims

    def _candidates(self, t: str, pool: str) -> list[InstanceView]:
        view = self.view
        free = [i for i in view.instances
                if i.alive and i.agent_type != t and view.pool_of(i.agent_type) == pool
                and i.instance_id not in self.keep and i.instance_id not in self.killed]
        return sorted(free, key=lambda i: (i.running, i.load, i.utilisation))
