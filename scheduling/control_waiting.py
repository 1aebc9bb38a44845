"""The waiting room: agent calls waiting for room for an instance of their type.

A call to an agent type with no live instance and no room left in the run's capacity
(other types' instances hold the reservations) waits here when one instance of the
type could fit the capacity at all; one that never could is refused at once. The room
is a local controller that never runs its calls, so a waiting call gets its
dependencies' values and its consumers' registrations like a placed call, and leaves
by the migration protocol (control_local.py) once its type has an instance: the host
(control_cluster.py) places the calls of a type first come first placed when room
may have freed (a kill gives a reservation back; a provision or an activation adds an
instance). Types do not wait behind each other: a call of a small type may take room
that a larger type's older call could not use.

The wait is bounded: a call ready to run (every dependency value in) for `wait_s`
with still no room moves to its type's unplaced controller (`unplaced(type)`), which
fails it, so that its consumers and creator get the failure the way they get any other.
One per type: a controller keys a session's records by its own agent type.
"""

from __future__ import annotations

from collections import deque

from scheduling.control import FutureStatus, FutureView
from scheduling.control_local import LocalController
from scheduling.control_rules import RuleTable

WAITING_ROOM = "waiting-for-resources"


def unplaced(agent_type: str) -> str:
    return f"unplaced:{agent_type}"

_SLOTS = 1 << 30  # the unplaced controller fails every call it holds at once


class WaitingRoom:
    def __init__(self, rules: RuleTable, wait_s: float) -> None:
        self.wait_s = wait_s
        self.hold = LocalController(WAITING_ROOM, "", rules, executes=False)
        self.rules = rules
        self.sinks: dict[str, LocalController] = {}
        self._queues: dict[str, deque[str]] = {}  # agent type -> its calls, oldest first
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

    def park(self, agent_type: str, fid: str) -> None:
        self._queues.setdefault(agent_type, deque()).append(fid)

    def queued(self, agent_type: str) -> bool:
        return agent_type in self._queues

    def types(self) -> list[str]:
        return list(self._queues)

    def head(self, agent_type: str) -> FutureView | None:
        """The type's oldest waiting call, once it is here (None: it is not, or its
        Submit is still on its way; the next `unpark` after it arrives places it)."""
        queue = self._queues.get(agent_type)
        h = self.hold.held.get(queue[0]) if queue else None
        if h is None or h.view.status not in (FutureStatus.WAITING, FutureStatus.QUEUED):
            return None
        return h.view

    def leave(self, agent_type: str) -> None:
        """The type's head call is on its way out."""
        queue = self._queues[agent_type]
        queue.popleft()
        if not queue:
            del self._queues[agent_type]

    def set_turn(self, fid: str, turn: int) -> None:
        """A stateful agent's call takes its turn in its session as it leaves, so that
        the calls that failed waiting leave no gap in the turns its instance expects."""
        h = self.hold.held[fid]
        h.view = h.view._replace(turn=turn)

    def due(self, now: float) -> list[tuple[str, FutureView]]:
        """(agent type, call) for each call ready for `wait_s` or longer; they leave
        their queues (the caller sends them to their unplaced controllers)."""
        out: list[tuple[str, FutureView]] = []
        for agent_type, queue in list(self._queues.items()):
            for fid in list(queue):
                h = self.hold.held.get(fid)
                if h is None:
                    continue
                ready = h.view.queued_at
                if h.view.status is FutureStatus.QUEUED and ready is not None \
                        and now - ready >= self.wait_s:
                    out.append((agent_type, h.view))
                    queue.remove(fid)
            if not queue:
                del self._queues[agent_type]
        return out

    def next_deadline(self) -> float | None:
        """When the first ready call's wait ends (None: no call here is ready yet)."""
        times = [h.view.queued_at + self.wait_s for h in self.hold.held.values()
                 if h.view.status is FutureStatus.QUEUED and h.view.queued_at is not None]
        return min(times, default=None)
