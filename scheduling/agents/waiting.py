"""The waiting room: agent calls waiting for room for an instance of their type.

A call to an agent type with no live instance and no room left in the run's capacity
(other types' instances hold the reservations) waits here when one instance of the
type could fit the capacity at all; one that never could is refused at once. The room
is a local controller that never runs its calls, so a waiting call gets its
dependencies' values and its consumers' registrations like a placed call, and leaves
by the migration protocol (local.py) once its type has an instance: the host
(parking.py) places the calls when room may have freed (a kill gives a
reservation back; a provision or an activation adds an instance).

Room goes first come first served among the calls ready to run: while a ready call
waits, no younger call of another type takes room for a new instance (it may still use
an instance its type has), so a small type cannot keep taking room that an older,
larger call waits for. A call not ready yet (a dependency still runs, for as long as it
takes) holds no one back: it keeps its place in its type's queue and takes room that is
free when its turn comes, and from when it is ready it holds back the calls younger than
it. Every waiting call can fit the capacity alone, so the room it waits for comes once
enough is killed, or its wait ends: a call holds others back for at most `wait_s`.

The wait is bounded: a call ready to run (every dependency value in) for `wait_s`
with still no room moves to its type's unplaced controller (`unplaced(type)`), which
fails it, so that its consumers and creator get the failure the way they get any other.
A call whose dependency failed does not wait for room to fail: it fails here at once.
One per type: a controller keys a session's records by its own agent type.
"""

from __future__ import annotations

import heapq
from collections import deque

from scheduling.agents.local import LocalController, _Held
from scheduling.agents.messages import Message, MigrateRequest, Value
from scheduling.agents.policy import MOVABLE, FutureStatus, FutureView
from scheduling.agents.rules import RuleTable

WAITING_ROOM = "waiting-for-resources"


def unplaced(agent_type: str) -> str:
    return f"unplaced:{agent_type}"

_SLOTS = 1 << 30  # the unplaced controller fails every call it holds at once


class _Hold(LocalController):
    """The room's controller. A call here whose dependency failed ends failed at once
    (its consumers and creator hear it as from any failed call): room it got later
    would only serve to fail it, and its consumers would wait for that meanwhile."""

    def __init__(self, rules: RuleTable) -> None:
        super().__init__(WAITING_ROOM, "", rules, executes=False)
        self.failed: list[tuple[FutureView, str]] = []  # (call, its failed dependency)
        # calls placed or expired whose move is not here yet: they fail where they go
        self.leaving: set[str] = set()
        # agent type -> (creation order, call) of its calls that became ready waiting, a
        # heap: entries of calls that left since are dropped as `first_ready` meets them
        self.ready: dict[str, list[tuple[int, str]]] = {}

    def _maybe_ready(self, h: _Held, now: float) -> None:
        was = h.view.status
        super()._maybe_ready(h, now)
        v = h.view
        if v.status is not was and v.future_id not in self.leaving:
            heapq.heappush(self.ready.setdefault(v.agent_type, []), (v.seq, v.future_id))

    def _migrate_request(self, m: MigrateRequest, now: float) -> list[Message]:
        self.leaving.discard(m.future_id)
        return super()._migrate_request(m, now)

    def _value(self, m: Value, now: float) -> list[Message]:
        h = self.held.get(m.consumer) if m.consumer is not None else None
        if h is None:
            if m.consumer is not None and m.consumer in self.done:
                return []  # it failed early: its other dependencies' values have no use
            return super()._value(m, now)
        out = super()._value(m, now)
        if not m.ok and h.view.status in MOVABLE and m.consumer not in self.leaving:
            self._unqueue(h)
            self.failed.append((h.view, m.dep))
            out += self._close(h, None, False)
        return out


class WaitingRoom:
    def __init__(self, rules: RuleTable, wait_s: float) -> None:
        self.wait_s = wait_s
        self.hold = _Hold(rules)
        self.rules = rules
        self.sinks: dict[str, LocalController] = {}
        # agent type -> its calls as (creation order, call), oldest first
        self._queues: dict[str, deque[tuple[int, str]]] = {}
        self.expiring: dict[str, str] = {}  # call on its way to be failed -> why

    def __len__(self) -> int:
        return sum(map(len, self._queues.values())) + len(self.expiring)

    def sink(self, agent_type: str) -> LocalController:
        """The type's unplaced controller, made at its first expired call."""
        c = self.sinks.get(agent_type)
        if c is None:
            c = self.sinks[agent_type] = LocalController(unplaced(agent_type), agent_type,
                                                         self.rules, slots=_SLOTS)
        return c

    def park(self, agent_type: str, seq: int, fid: str) -> None:
        """`seq`: the call's creation order, which orders room across types."""
        self._queues.setdefault(agent_type, deque()).append((seq, fid))

    def empty(self) -> bool:
        """No call waits for room (calls on their way to fail do not count)."""
        return not self._queues

    def queued(self, agent_type: str) -> bool:
        return agent_type in self._queues

    def first_ready(self, agent_type: str) -> int | None:
        """The creation order of the type's oldest ready call (None: none is ready):
        the calls of other types younger than it wait for room behind it."""
        heap = self.hold.ready.get(agent_type)
        held, leaving = self.hold.held, self.hold.leaving
        while heap:
            seq, fid = heap[0]
            h = held.get(fid)
            if h is not None and fid not in leaving and _ready(h.view):
                return seq  # still in its type's queue: it leaves only as leaving or closed
            heapq.heappop(heap)
        return None

    def holding_back(self) -> list[str]:
        """The types with a ready call waiting, the one with the oldest first: they
        hold back a new call of another type from room for a new instance."""
        firsts = {t: r for t in self._queues if (r := self.first_ready(t)) is not None}
        return sorted(firsts, key=firsts.__getitem__)

    def next_type(self, skip: set[str]) -> str | None:
        """The type, not in `skip`, whose head call has waited longest."""
        queues = self._queues
        return min((t for t in queues if t not in skip), key=lambda t: queues[t][0][0],
                   default=None)

    def head(self, agent_type: str) -> FutureView | None:
        """The type's oldest waiting call, once it is here (None: it is not, or its
        Submit is still on its way; the next `unpark` after it arrives places it)."""
        queue = self._queues.get(agent_type)
        h = self.hold.held.get(queue[0][1]) if queue else None
        if h is None or h.view.status not in MOVABLE:
            return None
        return h.view

    def leave(self, agent_type: str) -> None:
        """The type's head call is on its way out."""
        queue = self._queues[agent_type]
        self.hold.leaving.add(queue.popleft()[1])
        if not queue:
            self._forget(agent_type)

    def drop(self, agent_type: str, fid: str) -> None:
        """A call that ended here (its dependency failed) leaves its type's queue."""
        queue = self._queues[agent_type]
        queue.remove(next(e for e in queue if e[1] == fid))
        if not queue:
            self._forget(agent_type)

    def _forget(self, agent_type: str) -> None:
        del self._queues[agent_type]
        self.hold.ready.pop(agent_type, None)

    def set_turn(self, fid: str, turn: int) -> None:
        """A stateful agent's call takes its turn in its session as it leaves, so that
        the calls that failed waiting leave no gap in the turns its instance expects."""
        h = self.hold.held[fid]
        h.view = h.view._replace(turn=turn)

    def waiting(self) -> list[FutureView]:
        """The calls waiting for room, oldest first per type, without an executor: the
        view shows them placed nowhere yet (ControlView.waiting_for_room)."""
        held = self.hold.held
        return [h.view._replace(executor=None) for queue in self._queues.values()
                for _, fid in queue if (h := held.get(fid)) is not None
                and h.view.status in MOVABLE]

    def due(self, now: float) -> list[tuple[str, FutureView]]:
        """(agent type, call) for each call ready for `wait_s` or longer; they leave
        their queues (the caller sends them to their unplaced controllers)."""
        out: list[tuple[str, FutureView]] = []
        for agent_type, queue in list(self._queues.items()):
            for entry in list(queue):
                h = self.hold.held.get(entry[1])
                if h is None:
                    continue
                ready = h.view.queued_at
                if _ready(h.view) and ready is not None and now - ready >= self.wait_s:
                    out.append((agent_type, h.view))
                    queue.remove(entry)
                    self.hold.leaving.add(entry[1])
            if not queue:
                self._forget(agent_type)
        return out

    def next_deadline(self) -> float | None:
        """When the first ready call's wait ends (None: no call here is ready yet)."""
        times = [h.view.queued_at + self.wait_s for h in self.hold.held.values()
                 if _ready(h.view) and h.view.queued_at is not None]
        return min(times, default=None)


def _ready(view: FutureView) -> bool:
    """Every dependency value is in: its wait for room counts, and it holds back the
    younger calls of other types."""
    return view.status is FutureStatus.QUEUED and view.queued_at is not None
