"""Calls parked in the waiting room (scheduling/agents/waiting.py) until there is room.

With a `resource_wait_s`, a call to a type with no live instance and no room for one in
the capacity waits in the room until room frees, or fails after that long; without,
it is refused (NoCapacity). Room goes first come first served across types among the
calls ready to run (one whose dependency still runs holds no one back); a waiting call
whose dependency failed fails at once. The cluster places the waiting calls whenever
room may have freed: a kill gives a reservation back, a provision or an activation adds
an instance, a waiting call leaves.
"""

from __future__ import annotations

import math
from typing import Any

from scheduling.agents.accounting import bump
from scheduling.agents.delivery import Delivery
from scheduling.agents.local import LocalController
from scheduling.agents.messages import Message, MigrateRequest
from scheduling.agents.policy import Directives
from scheduling.agents.resources import NoCapacity, Short, describe, never_fits, short_of
from scheduling.agents.waiting import WAITING_ROOM, WaitingRoom


class Parking(Delivery):
    """A layer of `Cluster` (cluster.py)."""

    def __init__(self, resource_wait_s: float | None) -> None:
        """`resource_wait_s`: how long a ready call waits for room for an instance of its
        type before it fails (None or <= 0: a call with no room is refused at once);
        the host calls `expire` to end the waits that ran out."""
        self.room: WaitingRoom | None = None
        self._dependency_failed: list[tuple[str, str]] = []  # (waiting call, failed dependency)
        if resource_wait_s is not None and resource_wait_s > 0:
            self.room = WaitingRoom(self.rules, resource_wait_s)
            self.controllers[WAITING_ROOM] = self.room.hold

    def _settle(self, c: LocalController, out: list[Message], m: Message, now: float) -> None:
        super()._settle(c, out, m, now)
        # the room fails a waiting call whose dependency failed as it handles the value
        if self.room is not None and c is self.room.hold and self.room.hold.failed:
            self._failed_waiting(now)

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
                room.set_turn(view.future_id, bump(self._turns, view.session_id, agent_type))
            self._event("future.placed", id=view.future_id, session_id=view.session_id,
                        agent_type=agent_type, instance=target,
                        reason=f"{how}, after {now - view.created_at:.1f} s waiting "
                               f"for resources",
                        stage=view.stage, attempt=view.attempt)
            self.send((MigrateRequest(WAITING_ROOM, view.future_id, target),), now)


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


def _short_fields(agent_type: str, short: Short | None) -> dict[str, Any]:
    """A waiting call's trace fields: the resource it lacks, needed vs free."""
    if short is None:  # room freed since: it is placed at the next `unpark`
        return {"resource": None, "reason": f"{agent_type}'s instance fits again"}
    return {"resource": short.key, "need": short.need, "free": short.free,
            "capacity": short.have, "reason": describe(agent_type, short)}

