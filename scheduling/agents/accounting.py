"""The cluster's records of each session's calls, and its trace events.

A call's metadata (`CallMeta`: session, stage, where it was placed, attempt, creator), the
calls of each session and the instances migration took it to (so that forgetting a
session reads only its own), the per-session turn and attempt counters, and the live
calls per session, per stage and per attempt that views show as `SessionView`s.

The per-call path only appends a count (`_count`); the global loop's view folds them
(`_fold`), so a call costs one list append here whatever the number of sessions.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

from scheduling.agents.policy import SessionView

FOLD_AT = 4096  # session counts waiting for a view; past this the call that adds one folds


class Accounting:
    """The bottom layer of `Cluster` (cluster.py): its records, no behaviour of its own."""

    def __init__(self, record_events: bool) -> None:
        self.record_events = record_events
        self.events: list[dict[str, Any]] = []
        self._turns: dict[str, dict[str, int]] = {}  # session -> agent type -> next turn
        self._attempts: dict[str, dict[str, int]] = {}  # session -> call key -> calls
        self._meta: dict[str, CallMeta] = {}
        self._calls: dict[str, list[str]] = {}  # session -> its calls, for forgetting it
        self._visited: dict[str, set[str]] = {}  # session -> instances migration took it to
        self._tally: dict[str, Tally] = {}  # live agent calls per session
        # (tally, stage, attempt, +1 or -1) not folded into the tallies yet: only views
        # read them, so the per-call path appends and the global loop folds
        self._counted: list[tuple[Tally, int, int, int]] = []
        self._sessions: dict[str, SessionView] = {}  # the tallies as the view shows them
        self._stale: set[str] = set()  # sessions whose SessionView is out of date

    def _visit(self, session_id: str, instance_id: str) -> None:
        self._visited.setdefault(session_id, set()).add(instance_id)

    def _count(self, tally: Tally, stage: int, attempt: int, delta: int) -> None:
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
            tally = self._tally[session_id] = Tally(session_id)
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



class CallMeta(NamedTuple):
    session: str
    stage: int
    placed: str  # the instance it was placed on (it may have moved since)
    attempt: int
    creator: str



def bump(table: dict[str, dict[str, int]], session_id: str, key: str) -> int:
    """The session's count under `key` before this call, counting this one."""
    mine = table.get(session_id)
    if mine is None:
        table[session_id] = {key: 1}
        return 0
    n = mine.get(key, 0)
    mine[key] = n + 1
    return n



class Tally:
    """Live calls of one session, counted per stage and per attempt."""

    __slots__ = ("attempts", "live", "session", "stages", "state_s")

    def __init__(self, session: str) -> None:
        self.session = session
        self.live = 0
        self.state_s = 0.0  # set_state_cost's, kept with the tally: forgotten with it
        self.stages: dict[int, int] = {}
        self.attempts: dict[int, int] = {}
