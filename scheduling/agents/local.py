"""The component-level (local) controller of one agent instance: event-driven.

It holds the calls placed on its instance, orders the ready ones by the installed
priority (then creation order; a stateful agent's calls of one session by turn), runs
at most `slots` at a time, pushes each finished call's value to its consumers, and
keeps the metrics the global controller reads. Per call it does a few dict operations
and one heap push/pop; installing a priority re-keys only that session's queued calls.

Migration (NALAR Fig. 8), driven by messages so that no step needs a global lock:
1. the source takes the call off its queue (MIGRATING); a call that started is refused;
2. for each dependency value not yet here it asks the producer to redirect it to the
   destination, or, if it was already sent, waits for it to arrive;
3. then it tells the creator the executor changed, and
4. sends the call with the values it holds to the destination (Transfer), leaving a
   forwarding pointer for messages still on their way;
5. a session migration also moves the session's state, once none of the session's
   calls runs at the source; the destination holds the session's calls until then;
6. the destination activates the call: queued once every value is there.
A call is only ever queued on the one controller that holds it, so it runs once.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from operator import attrgetter
from types import MappingProxyType
from typing import Any, NamedTuple, TypeVar

from scheduling.agents.load import LoadIndex
from scheduling.agents.messages import (
    AddConsumer,
    DepValue,
    ExecutorChanged,
    Message,
    MigrateRequest,
    MigrateSession,
    Redirect,
    RedirectReply,
    StateTransfer,
    Submit,
    Transfer,
    Value,
)
from scheduling.agents.policy import FutureStatus, FutureView, InstanceState, InstanceView
from scheduling.agents.rules import RuleTable

WAITING, QUEUED, RUNNING = FutureStatus.WAITING, FutureStatus.QUEUED, FutureStatus.RUNNING
MIGRATING = FutureStatus.MIGRATING
_STATUS = FutureView._fields.index("status")
_QUEUED_AT = FutureView._fields.index("queued_at")
_STARTED_AT = FutureView._fields.index("started_at")
_VIEW = attrgetter("view")
EWMA = 0.2
UTIL_TAU_S = 30.0  # time constant of the utilisation metric
SessionKey = tuple[str, str]  # (session id, agent type)
Where = tuple[str, int]  # (instance, the consumer's hop there)


class Started(NamedTuple):
    future: FutureView
    values: dict[str, tuple[object, bool]]


# the sets below are replaced, never changed in place, so that a call without
# dependencies (most) shares this one instead of allocating its own
_NONE: frozenset[str] = frozenset()
# likewise a call's tables (dependency values, consumers, early redirects) are empty
# for most calls: they share this read-only one until their first entry (`_put`), which
# saves three dicts per call, and their memory, at 10^5 live calls
_NOTHING: Mapping[Any, Any] = MappingProxyType({})
K = TypeVar("K")
V = TypeVar("V")


def _put(table: Mapping[K, V], key: K, value: V) -> dict[K, V]:
    """`table[key] = value`, for a table that may still be the shared empty one."""
    out = table if isinstance(table, dict) else {}
    out[key] = value
    return out


def _take(table: Mapping[K, V], key: K, default: V) -> V:
    """`table.pop(key, default)`, likewise."""
    return table.pop(key, default) if isinstance(table, dict) else default


class _Held:
    __slots__ = ("consumers", "dep_at", "destination", "missing", "notes", "queued",
                 "redirected", "replies", "values", "version", "view")

    def __init__(self, view: FutureView, missing: frozenset[str],
                 values: Mapping[str, tuple[object, bool]],
                 dep_at: tuple[tuple[str, str], ...],
                 consumers: Mapping[str, Where], notes: Mapping[str, Where]) -> None:
        self.view = view
        self.missing = missing
        self.values = values
        self.dep_at = dep_at  # (dependency, where its creator last saw it)
        self.consumers = consumers  # consumer call -> where (and at which hop) it runs
        self.notes = notes  # redirects that came before the consumer's registration
        self.version = 0  # of its heap entry: an entry with an older one is stale
        self.queued = False  # has a live heap entry (a parked call has none)
        self.destination: str | None = None
        self.replies = _NONE  # migrating: the redirects not answered yet
        self.redirected = _NONE


class _Done:
    __slots__ = ("consumers", "notes", "ok", "value")

    def __init__(self, value: object, ok: bool, consumers: Mapping[str, Where],
                 notes: Mapping[str, Where]) -> None:
        self.value, self.ok = value, ok
        self.consumers, self.notes = consumers, notes


class LocalController:
    def __init__(self, instance_id: str, agent_type: str, rules: RuleTable, *,
                 node: str = "local", slots: int = 1, stateful: bool = False,
                 executes: bool = True, now: float | None = None) -> None:
        self.id, self.agent_type, self.rules = instance_id, agent_type, rules
        self.node, self.slots, self.stateful, self.executes = node, slots, stateful, executes
        self.state_ = InstanceState.ACTIVE
        self.held: dict[str, _Held] = {}
        self.done: dict[str, _Done] = {}
        self.moved: dict[str, tuple[str, str, int]] = {}  # call -> (to, session, hop it left)
        self.stash: dict[str, list[Message]] = {}  # messages about calls not here yet
        self.running: set[str] = set()
        self.directory: dict[str, str] = {}  # creator role: where my calls execute
        self.results: dict[str, tuple[object, bool]] = {}  # creator role
        self.state: dict[SessionKey, object] = {}
        # session -> its calls in `done` or `moved`, so that forgetting it reads only those
        self._records: dict[str, list[str]] = {}
        # the host's least-loaded index while this instance takes new calls
        self.index: LoadIndex | None = None
        self.refused: list[tuple[str, str]] = []
        self.forwarded = 0
        self.values_forwarded = 0  # stays 0 when migration waits for in-flight values
        self.completed = 0
        self.mean_service_s = 0.0
        self.mean_wait_s = 0.0
        self._started = 0  # calls started here: the first wait sets the mean
        # an instance counts as fully used until it has a history, so that a policy
        # does not reclaim what was provisioned a moment ago
        self._util = 1.0
        self._util_at: float | None = now
        self._queue: list[tuple[float, int, int, str]] = []
        self._arrivals: deque[tuple[float, str]] = deque()  # (queued at, call): the oldest
        self._n_queued = 0  # calls with a live heap entry
        self._n_parked = 0
        self._next_turn: dict[SessionKey, int] = {}
        self._parked: dict[SessionKey, dict[int, str]] = {}
        self._expecting: dict[SessionKey, list[str]] = {}  # held until the state arrives
        self._departed: dict[SessionKey, tuple[str, bool]] = {}
        self._running_of: dict[SessionKey, int] = {}
        self._handlers: dict[type, Callable[[Any, float], list[Message]]] = {
            Submit: self._submit, AddConsumer: self._add_consumer, Value: self._value,
            MigrateRequest: self._migrate_request, MigrateSession: self._migrate_session,
            Redirect: self._redirect, RedirectReply: self._redirect_reply,
            ExecutorChanged: self._executor_changed, Transfer: self._transfer,
            StateTransfer: self._state_transfer,
        }

    @property
    def load(self) -> int:
        return len(self.held)

    def handle(self, m: Message, now: float) -> list[Message]:
        return self._handlers[type(m)](m, now)

    # --- intake -----------------------------------------------------------------------

    def _submit(self, m: Submit, now: float) -> list[Message]:
        return self.submit(m.future, m.dep_at, now)

    def submit(self, f: FutureView, dep_at: tuple[tuple[str, str], ...],
               now: float) -> list[Message]:
        """A new call placed here (the `Submit` message, which a host in the same
        process may skip)."""
        if f.executor != self.id or f.status is not WAITING:
            f = f._replace(executor=self.id, status=WAITING)
        h = _Held(f, frozenset(f.dependencies) if f.dependencies else _NONE, _NOTHING, dep_at,
                  _NOTHING, _NOTHING)
        return self._arrive(h, now)

    def _transfer(self, m: Transfer, now: float) -> list[Message]:
        h = _Held(m.future._replace(executor=self.id, status=WAITING), frozenset(m.pending),
                  {dep: (value, ok) for dep, value, ok in m.values}, m.dep_at,
                  dict(m.consumers), dict(m.notes))
        return self._arrive(h, now)

    def _arrive(self, h: _Held, now: float) -> list[Message]:
        # the common case (nothing moving, nothing early) touches only non-empty tables
        fid = h.view.future_id
        self.held[fid] = h
        if self.index is not None:
            self.index.set(self.id, len(self.held))
        if self.moved:
            self.moved.pop(fid, None)  # back again
        out: list[Message] = []
        if self._departed or self._expecting:
            key = (h.view.session_id, h.view.agent_type)
            departed = self._departed.get(key)
            if departed is not None and not self.stateful:
                out += self._begin_migration(h, departed[0])  # the session left: follow it
            elif key in self._expecting:
                self._expecting[key].append(fid)
        if self.stash:
            for early in self.stash.pop(fid, ()):
                out += self.handle(early, now)
        if fid in self.held:
            self._maybe_ready(h, now)
        return out

    def hold_running(self, view: FutureView, now: float) -> list[Message]:
        """A call run outside the controllers (a tool); `finish` pushes its value."""
        fid = view.future_id
        self.held[fid] = _Held(view, _NONE, _NOTHING, (), _NOTHING, _NOTHING)
        if self.index is not None:
            self.index.set(self.id, len(self.held))
        self.running.add(fid)
        key = (view.session_id, view.agent_type)
        self._running_of[key] = self._running_of.get(key, 0) + 1
        out: list[Message] = []
        for early in self.stash.pop(fid, ()):
            out += self.handle(early, now)
        return out

    def expect(self, key: SessionKey) -> None:
        """Host, installing a session migration here: hold its calls until its state."""
        self._expecting.setdefault(key, [])
        self._departed.pop(key, None)

    def expecting(self, key: SessionKey) -> bool:
        return key in self._expecting

    # --- readiness and the queue --------------------------------------------------------

    def _maybe_ready(self, h: _Held, now: float) -> None:
        v = h.view
        if v.status is not WAITING or h.missing or \
                (self._expecting and (v.session_id, v.agent_type) in self._expecting):
            return
        fields = list(v)
        fields[_STATUS], fields[_QUEUED_AT] = QUEUED, now
        v = h.view = tuple.__new__(FutureView, fields)
        if self.executes:  # `_oldest_queued` pops these, and only an executor's snapshot reads it
            self._arrivals.append((now, v.future_id))
        if self.stateful and v.turn is not None:
            self._push_in_turn(h)
        else:
            self._push(h)

    def _push_in_turn(self, h: _Held) -> None:
        """A stateful agent runs a session's calls in turn: a later one is parked."""
        v = h.view
        key = (v.session_id, v.agent_type)
        turn = v.turn if v.turn is not None else 0
        if turn != self._next_turn.get(key, 0):
            self._parked.setdefault(key, {})[turn] = v.future_id
            self._n_parked += 1
            return
        self._push(h)

    def _push(self, h: _Held) -> None:
        v = h.view
        h.version += 1
        if self.executes:  # only `start_next` pops entries: a controller that never runs
            # its calls (the waiting room) would keep one per call it ever held
            rules = self.rules
            prio = rules.priority(v.session_id, v.agent_type) if rules.agent_priorities else \
                rules.priorities.get(v.session_id, 0.0)
            heapq.heappush(self._queue, (-prio, v.seq, h.version, v.future_id))
        if not h.queued:
            h.queued = True
            self._n_queued += 1

    def rekey(self, fid: str) -> bool:
        """Re-key a queued call after its priority was installed; False: it is not
        queued here. The host finds a session's calls from its own records: an index of
        queued calls by session kept here would cost every push and pop."""
        h = self.held.get(fid)
        if h is None or not h.queued:
            return False
        self._push(h)
        return True

    def start_next(self, now: float) -> Started | None:
        """The next call to run, if a slot is free; the host runs it, then `finish`."""
        if not self.executes or len(self.running) >= self.slots:
            return None
        queue, held = self._queue, self.held
        while queue:
            _, _, version, fid = heapq.heappop(queue)
            h = held.get(fid)
            if h is None or h.version != version or h.view.status is not QUEUED:
                continue  # stale: re-keyed, moved, or gone
            self._decay(now)
            h.queued = False
            self._n_queued -= 1
            fields = list(h.view)
            fields[_STATUS], fields[_STARTED_AT] = RUNNING, now
            h.view = v = tuple.__new__(FutureView, fields)
            self.running.add(fid)
            key = (v.session_id, v.agent_type)
            self._running_of[key] = self._running_of.get(key, 0) + 1
            waited = now - (v.queued_at if v.queued_at is not None else now)
            self._started += 1
            self.mean_wait_s += (EWMA if self._started > 1 else 1.0) * (waited - self.mean_wait_s)
            return tuple.__new__(Started, (v, dict(h.values) if h.values else {}))
        return None

    def has_startable(self) -> bool:
        if not self.executes or len(self.running) >= self.slots:
            return False
        while self._queue and self._stale(self._queue[0]):
            heapq.heappop(self._queue)
        return bool(self._queue)

    def _stale(self, entry: tuple[float, int, int, str]) -> bool:
        h = self.held.get(entry[3])
        return h is None or h.version != entry[2] or h.view.status is not QUEUED

    def _unqueue(self, h: _Held) -> None:
        if h.queued:
            h.queued = False
            self._n_queued -= 1

    def finish(self, fid: str, value: object, ok: bool, now: float) -> list[Message]:
        """The call ran (ok) or raised; push its value to its consumers and creator."""
        if fid not in self.running:
            raise ValueError(f"{fid} is not running on {self.id}")
        self._decay(now)
        self.running.discard(fid)
        h = self.held[fid]
        v = h.view
        out = self._close(h, value, ok)
        self.completed += 1
        if v.started_at is not None:  # the first sample sets the mean, not a fifth of it
            weight = EWMA if self.completed > 1 else 1.0
            self.mean_service_s += weight * (now - v.started_at - self.mean_service_s)
        key = (v.session_id, v.agent_type)
        self._running_of[key] -= 1
        if self.stateful and v.turn is not None:
            self._advance_turn(key, v.turn)
        departed = self._departed.get(key) if self._departed else None
        if departed is not None and departed[1] and not self._running_of[key]:
            out.append(self._send_state(key, departed[0]))
        return out

    def _close(self, h: _Held, value: object, ok: bool) -> list[Message]:
        """The call is over here: keep its value for late consumers, push it to the
        consumers and the creator."""
        v = h.view
        fid = v.future_id
        del self.held[fid]
        if self.index is not None:
            self.index.set(self.id, len(self.held))
        self.done[fid] = _Done(value, ok, h.consumers, h.notes)
        self._record(v.session_id, fid)
        out: list[Message] = [Value(loc, fid, c, value, ok, hop)
                              for c, (loc, hop) in h.consumers.items()]
        out.append(Value(v.creator, fid, None, value, ok))
        return out

    def _advance_turn(self, key: SessionKey, turn: int) -> None:
        self._next_turn[key] = turn + 1
        parked = self._parked.get(key)
        if parked and (turn + 1) in parked:
            self._n_parked -= 1
            self._push(self.held[parked.pop(turn + 1)])

    # --- dependency values (push-based readiness) -----------------------------------

    def _add_consumer(self, m: AddConsumer, now: float) -> list[Message]:
        h = self.held.get(m.dep)
        if h is not None:
            h.consumers = _put(h.consumers, m.consumer, _take(h.notes, m.consumer, (m.at, 0)))
            h.view = h.view._replace(consumers=(*h.view.consumers, m.consumer))
            return []
        d = self.done.get(m.dep)
        if d is not None:
            loc, hop = _take(d.notes, m.consumer, (m.at, 0))
            d.consumers = _put(d.consumers, m.consumer, (loc, hop))
            return [Value(loc, m.dep, m.consumer, d.value, d.ok, hop)]
        return self._elsewhere(m.dep, m, AddConsumer(self._pointer(m.dep), m.dep, m.consumer,
                                                      m.at))

    def _value(self, m: Value, now: float) -> list[Message]:
        if m.consumer is None:
            self.results[m.dep] = (m.value, m.ok)
            return []
        h = self.held.get(m.consumer)
        if h is None:
            left = self.moved.get(m.consumer)
            if left is not None and m.hops > left[2]:
                self.stash.setdefault(m.consumer, []).append(m)  # it is coming back here
                return []
            self.values_forwarded += left is not None
            return self._elsewhere(m.consumer, m, Value(self._pointer(m.consumer), m.dep,
                                                        m.consumer, m.value, m.ok, m.hops))
        if m.dep not in h.missing:
            raise RuntimeError(f"{m.consumer} got the value of {m.dep} twice on {self.id}")
        h.missing = h.missing - {m.dep}
        h.values = _put(h.values, m.dep, (m.value, m.ok))
        if h.view.status is MIGRATING:
            return self._try_finish_migration(h)
        self._maybe_ready(h, now)
        return []

    def _pointer(self, fid: str) -> str:
        moved = self.moved.get(fid)
        return moved[0] if moved is not None else self.id

    def _elsewhere(self, fid: str, m: Message, forwarded: Message) -> list[Message]:
        """A message about a call that left (forward it) or has not arrived (keep it)."""
        if fid in self.moved:
            self.forwarded += 1
            return [forwarded]
        self.stash.setdefault(fid, []).append(m)
        return []

    def _executor_changed(self, m: ExecutorChanged, now: float) -> list[Message]:
        self.directory[m.future_id] = m.executor
        return []

    # --- migration --------------------------------------------------------------------

    def _migrate_request(self, m: MigrateRequest, now: float) -> list[Message]:
        h = self.held.get(m.future_id)
        reason = self._cannot_move(h, m.destination)
        if reason is not None or h is None:
            self.refused.append((m.future_id, reason or "not here"))
            return []
        return self._begin_migration(h, m.destination)

    def _cannot_move(self, h: _Held | None, destination: str) -> str | None:
        if h is None:
            return "not here (finished, or moved on)"
        if self.stateful:
            return "stateful agent"
        if h.view.status not in (WAITING, QUEUED):
            return f"already {h.view.status.value}"
        if destination == self.id:
            return "already here"
        return None

    def _migrate_session(self, m: MigrateSession, now: float) -> list[Message]:
        key = (m.session_id, m.agent_type)
        if m.with_state:
            # later arrivals follow the state; without state they were placed freely
            self._departed[key] = (m.destination, True)
        out: list[Message] = []
        for h in [h for h in self.held.values() if (h.view.session_id, h.view.agent_type) == key]:
            if self._cannot_move(h, m.destination) is None:
                out += self._begin_migration(h, m.destination)
        if m.with_state and not self._running_of.get(key) and key not in self._expecting:
            out.append(self._send_state(key, m.destination))
        return out

    def _send_state(self, key: SessionKey, destination: str) -> StateTransfer:
        has = key in self.state
        return StateTransfer(destination, key[0], key[1], self.state.pop(key, None), has)

    def _state_transfer(self, m: StateTransfer, now: float) -> list[Message]:
        key = (m.session_id, m.agent_type)
        held = self._expecting.pop(key, [])
        departed = self._departed.get(key)
        if departed is not None:
            return [StateTransfer(departed[0], m.session_id, m.agent_type, m.state, m.has_state)]
        if m.has_state:
            self.state[key] = m.state
        out: list[Message] = []
        for fid in held:
            h = self.held.get(fid)
            if h is not None:
                self._maybe_ready(h, now)
        return out

    def _begin_migration(self, h: _Held, destination: str) -> list[Message]:
        v = h.view
        if v.status is QUEUED:
            self._unqueue(h)
        h.version += 1  # its heap entry, if any, is now stale
        key = (v.session_id, v.agent_type)
        waiting = self._expecting.get(key)
        if waiting is not None and v.future_id in waiting:
            waiting.remove(v.future_id)
        h.view = v._replace(status=MIGRATING)
        h.destination = destination
        h.replies = h.missing
        dep_at = dict(h.dep_at)
        return [Redirect(dep_at.get(dep, self.id), dep, v.future_id, destination, self.id,
                         v.hops + 1) for dep in h.missing] + self._try_finish_migration(h)

    def _redirect(self, m: Redirect, now: float) -> list[Message]:
        h = self.held.get(m.dep)
        target = (m.destination, m.hops)
        if h is not None:
            if m.consumer in h.consumers:
                h.consumers = _put(h.consumers, m.consumer, target)
            else:
                h.notes = _put(h.notes, m.consumer, target)
            return [RedirectReply(m.reply_to, m.dep, m.consumer, True)]
        d = self.done.get(m.dep)
        if d is not None:
            if m.consumer in d.consumers:
                return [RedirectReply(m.reply_to, m.dep, m.consumer, False)]
            d.notes = _put(d.notes, m.consumer, target)
            return [RedirectReply(m.reply_to, m.dep, m.consumer, True)]
        return self._elsewhere(m.dep, m, Redirect(self._pointer(m.dep), m.dep, m.consumer,
                                                  m.destination, m.reply_to, m.hops))

    def _redirect_reply(self, m: RedirectReply, now: float) -> list[Message]:
        h = self.held[m.consumer]  # a migrating call stays until every reply came back
        h.replies = h.replies - {m.dep}
        if m.redirected and m.dep in h.missing:
            h.redirected = h.redirected | {m.dep}
        return self._try_finish_migration(h)

    def _try_finish_migration(self, h: _Held) -> list[Message]:
        if h.replies or not h.missing <= h.redirected or h.destination is None:
            return []
        v = h.view
        del self.held[v.future_id]
        if self.index is not None:
            self.index.set(self.id, len(self.held))
        self.moved[v.future_id] = (h.destination, v.session_id, v.hops)
        self._record(v.session_id, v.future_id)
        moved = v._replace(executor=h.destination, status=WAITING, queued_at=None,
                           hops=v.hops + 1)
        values: tuple[DepValue, ...] = tuple((d, val, ok) for d, (val, ok) in h.values.items())
        return [ExecutorChanged(v.creator, v.future_id, h.destination),
                Transfer(h.destination, moved, values, tuple(h.missing),
                         h.dep_at, tuple(h.consumers.items()),
                         tuple(h.notes.items()))]

    # --- the view -----------------------------------------------------------------------

    def _decay(self, now: float) -> None:
        """Fold the time since the last event into the utilisation: an exponentially
        weighted average of the running fraction over time."""
        at = self._util_at
        if at is None or now > at:
            if at is not None:
                keep = math.exp(-(now - at) / UTIL_TAU_S)
                busy = min(1.0, len(self.running) / self.slots)
                self._util = self._util * keep + busy * (1 - keep)
            self._util_at = now

    def snapshot(self, out: list[FutureView], now: float | None = None) -> InstanceView:
        """Appends this instance's live calls to `out`; returns its metrics. Costs a
        pass over the held calls in C, and no counting: the counters are kept as calls
        move. The per-call path keeps no copy of the views, so that it writes one table
        less per event."""
        out.extend(map(_VIEW, self.held.values()))
        if now is not None:
            self._decay(now)
        queued = self._n_queued + self._n_parked
        return InstanceView(self.id, self.agent_type, self.node, self.state_, self.slots,
                            queued, len(self.held) - queued - len(self.running),
                            len(self.running), self.completed, self.mean_service_s,
                            self.mean_wait_s, self._oldest_queued(), self._util)

    def _oldest_queued(self) -> float | None:
        arrivals = self._arrivals
        while arrivals:
            at, fid = arrivals[0]
            h = self.held.get(fid)
            if h is not None and h.view.status is QUEUED and h.view.queued_at == at:
                return at
            arrivals.popleft()
        return None

    def _record(self, session_id: str, fid: str) -> None:
        mine = self._records.get(session_id)
        if mine is None:
            self._records[session_id] = [fid]
        else:
            mine.append(fid)

    def forget_session(self, session_id: str, creations: Iterable[str] = ()) -> None:
        """The session ended: drop what it left behind here, reading only its own
        records (`creations`: its calls this controller created, as their creator).
        Every call an instance holds is of its agent type, so the session's keyed
        entries here are under that one key."""
        for fid in self._records.pop(session_id, ()):
            self.done.pop(fid, None)
            self.moved.pop(fid, None)
        for fid in creations:
            self.results.pop(fid, None)
            self.directory.pop(fid, None)
        key = (session_id, self.agent_type)
        for keyed in (self.state, self._next_turn, self._parked, self._departed,
                      self._running_of):
            keyed.pop(key, None)



