"""The policy pool Omega (H-MAS Sec. 3.5, Appendix C.1): ordering rules for the ready queue.

Every policy is a heap (O(log n) push and pop) keyed by a tuple; ties fall to arrival time
then request id, so a policy rebuilt from the same requests pops them in the same order as
one that received them one by one. ``switch`` moves a queue to another policy in place.
Keys whose only time-varying term is shared by all requests (LLF's ``now``, two-lane's
V_sys) drop that term: it cannot change the order, and a static key keeps the heap valid.
"""

from __future__ import annotations

import heapq
import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping
from itertools import count

from scheduling.slo.metrics import ESG_W_IN, ESG_W_OUT, gain
from scheduling.slo.prediction import QueuedRequest

Key = tuple[float, ...]
_Entry = tuple[Key, float, str, int, QueuedRequest]


def _arrival_order(requests: Iterable[QueuedRequest]) -> list[QueuedRequest]:
    return sorted(requests, key=lambda r: (r.arrival_s, r.request_id))


class OrderingPolicy(ABC):
    """A ready queue under one ordering rule. ``now`` is passed for rules that read time."""

    name: str = ""

    @abstractmethod
    def push(self, request: QueuedRequest, now: float) -> None: ...

    @abstractmethod
    def pop(self, now: float) -> QueuedRequest:
        """Remove and return the next request; IndexError when empty."""

    @abstractmethod
    def peek(self, now: float) -> QueuedRequest | None: ...

    @abstractmethod
    def drain(self) -> list[QueuedRequest]:
        """Empty the queue (and any per-policy state), returning every request once."""

    @abstractmethod
    def __len__(self) -> int: ...

    def rebuild(self, requests: Iterable[QueuedRequest], now: float) -> None:
        """Replace the contents, re-deriving all state in arrival order."""
        self.drain()
        for request in _arrival_order(requests):
            self.push(request, now)

    def remove(self, request_id: str, now: float) -> QueuedRequest | None:
        """Take one request out (an abort while queued); O(n log n), aborts are rare."""
        items = self.drain()
        found = next((r for r in items if r.request_id == request_id), None)
        self.rebuild((r for r in items if r is not found), now)
        return found


class _Heap:
    """A min-heap of requests with the deterministic tie-break shared by all policies."""

    def __init__(self) -> None:
        self._items: list[_Entry] = []
        self._seq = count()

    def push(self, key: Key, request: QueuedRequest) -> None:
        entry = (key, request.arrival_s, request.request_id, next(self._seq), request)
        heapq.heappush(self._items, entry)

    def pop(self) -> tuple[Key, QueuedRequest]:
        key, _, _, _, request = heapq.heappop(self._items)
        return key, request

    def peek(self) -> QueuedRequest | None:
        return self._items[0][4] if self._items else None

    def drain(self) -> list[QueuedRequest]:
        items = [entry[4] for entry in self._items]
        self._items = []
        self._seq = count()
        return items

    def __len__(self) -> int:
        return len(self._items)


class KeyedPolicy(OrderingPolicy):
    """A single heap ordered by ``key``; subclasses define only the key."""

    def __init__(self) -> None:
        self._heap = _Heap()

    @abstractmethod
    def key(self, request: QueuedRequest) -> Key: ...

    def push(self, request: QueuedRequest, now: float) -> None:
        self._heap.push(self.key(request), request)

    def pop(self, now: float) -> QueuedRequest:
        return self._heap.pop()[1]

    def peek(self, now: float) -> QueuedRequest | None:
        return self._heap.peek()

    def drain(self) -> list[QueuedRequest]:
        return self._heap.drain()

    def __len__(self) -> int:
        return len(self._heap)


class Fcfs(KeyedPolicy):
    """Arrival order: the availability baseline and the emergency-bypass policy."""

    name = "fcfs"

    def key(self, request: QueuedRequest) -> Key:
        return (request.arrival_s,)


class Edf(KeyedPolicy):
    """Earliest deadline D first."""

    name = "edf"

    def key(self, request: QueuedRequest) -> Key:
        return (request.deadline,)


class Sjf(KeyedPolicy):
    """Shortest predicted service time T_tot first."""

    name = "sjf"

    def key(self, request: QueuedRequest) -> Key:
        return (request.t_tot,)


class Srtf(KeyedPolicy):
    """Shortest remaining predicted time first (differs from SJF for re-queued requests)."""

    name = "srtf"

    def key(self, request: QueuedRequest) -> Key:
        return (request.remaining_s,)


class Llf(KeyedPolicy):
    """Least laxity D - now - remaining first; ``now`` is common to all, so it is dropped."""

    name = "llf"

    def key(self, request: QueuedRequest) -> Key:
        return (request.deadline - request.remaining_s,)


class StrictPriority(KeyedPolicy):
    """Highest ``priority`` first, FCFS within a priority."""

    name = "priority"

    def key(self, request: QueuedRequest) -> Key:
        return (-float(request.priority), request.arrival_s)


class Mlfq(KeyedPolicy):
    """Multi-level feedback by attained service: a request drops one level each time its
    generated tokens double past ``quantum_tokens``; FCFS within a level."""

    name = "mlfq"

    def __init__(self, levels: int = 4, quantum_tokens: int = 64) -> None:
        super().__init__()
        self.levels = levels
        self.quantum_tokens = quantum_tokens

    def level(self, request: QueuedRequest) -> int:
        quanta = request.generated_tokens / self.quantum_tokens
        return min(self.levels - 1, int(math.log2(1.0 + quanta)))

    def key(self, request: QueuedRequest) -> Key:
        return (float(self.level(request)), request.arrival_s)


class Wfq(KeyedPolicy):
    """Weighted fair queueing across tenants by virtual finish tags.

    A request's tag is max(V, tenant's last tag) + cost / weight, with cost T_tot (``wfq``) or
    1 (``stride``); V advances to the start tag of each popped request, so an idle tenant
    re-enters at the current virtual time instead of with banked credit.
    """

    name = "wfq"

    def __init__(self, weights: Mapping[str, float] | None = None, unit_cost: bool = False) -> None:
        super().__init__()
        self.weights = dict(weights or {})
        self.unit_cost = unit_cost
        self.name = "stride" if unit_cost else "wfq"
        self._vtime = 0.0
        self._last_finish: dict[str, float] = {}

    def key(self, request: QueuedRequest) -> Key:
        start = max(self._vtime, self._last_finish.get(request.tenant, 0.0))
        cost = 1.0 if self.unit_cost else max(request.t_tot, 1e-9)
        finish = start + cost / self.weights.get(request.tenant, 1.0)
        self._last_finish[request.tenant] = finish
        return (finish, start)

    def pop(self, now: float) -> QueuedRequest:
        key, request = self._heap.pop()
        self._vtime = max(self._vtime, key[1])
        return request

    def drain(self) -> list[QueuedRequest]:
        self._vtime = 0.0
        self._last_finish = {}
        return super().drain()


def esg_density(request: QueuedRequest, now: float) -> float:
    """The ESG ``request`` would earn if dispatched now, per second of predicted service:
    V_base(l_pred) * min(1, SLO_ttlt / TTLT) / T_tot, with TTLT = now - a + T_tot."""
    value = ESG_W_IN * request.prompt_tokens + ESG_W_OUT * request.l_pred
    slo_ttlt = request.slo.ttft_s + request.slo.tpot_s * request.l_pred
    service = max(request.t_tot, 1e-6)
    return value * gain(slo_ttlt, now - request.arrival_s + service) / service


class EsgDensity(OrderingPolicy):
    """Highest ESG density first (``esg_density``): the greedy order for a sum of
    V * min(1, S / C) over one server, where swapping two neighbours favours the one with
    more gain per second of service it holds the server for.

    Unlike T_tot, ESG weights long requests (V_base counts output twice, and SLO_ttlt grows
    with it), and a late request's gain decays only as 1 / TTLT: SJF's order starves
    exactly the requests worth most. A late request's density falls as it waits, so keys
    are re-derived every ``refresh_s`` of ``now`` (O(n) per refresh, not per pop); between
    refreshes a pushed request is keyed at its push time."""

    name = "esg"

    def __init__(self, refresh_s: float = 1.0) -> None:
        self.refresh_s = refresh_s
        self._heap = _Heap()
        self._keyed_at: float | None = None

    def push(self, request: QueuedRequest, now: float) -> None:
        self._heap.push((-esg_density(request, now),), request)

    def _refresh(self, now: float) -> None:
        if self._keyed_at is not None and now - self._keyed_at < self.refresh_s:
            return
        self._keyed_at = now
        for request in _arrival_order(self._heap.drain()):
            self.push(request, now)

    def pop(self, now: float) -> QueuedRequest:
        self._refresh(now)
        return self._heap.pop()[1]

    def peek(self, now: float) -> QueuedRequest | None:
        self._refresh(now)
        return self._heap.peek()

    def drain(self) -> list[QueuedRequest]:
        self._keyed_at = None
        return self._heap.drain()

    def __len__(self) -> int:
        return len(self._heap)


class EsgFastGate(OrderingPolicy):
    """ESG density order (``esg_density``), except that every ``fast_every``-th pop serves
    the shortest T_tot request that can still meet its TTFT: the two targets in one queue.

    Pure ESG density ranks a cheap on-time request below a long late one worth more, so
    under a burst nearly nothing meets its SLO; pure shortest-first (the two-lane policies)
    keeps TTFTs but leaves the requests worth most for last. On the Azure conversation
    trace at 30x in bench/slo.py's replay (full stack), every other pop to the fast gate
    kept 1.05x FCFS's ESG and raised goodput from 1.5 to 2.6 req/s; every 4th, 1.8 req/s.

    One request lives in both heaps: a pop from either leaves a stale entry in the other,
    skipped when it surfaces (``_live`` is the truth). A request that lost its TTFT leaves
    the fast heap for good (``now`` only grows), so only the fast heap's head is checked."""

    name = "esg_fast"

    def __init__(self, fast_every: int = 2, refresh_s: float = 1.0) -> None:
        self.fast_every, self.refresh_s = fast_every, refresh_s
        self._live: dict[str, QueuedRequest] = {}
        self._esg = _Heap()
        self._fast = _Heap()
        self._keyed_at: float | None = None
        self._pops = 0

    def push(self, request: QueuedRequest, now: float) -> None:
        self._live[request.request_id] = request
        self._esg.push((-esg_density(request, now),), request)
        if not _ttft_lost(request, now):
            self._fast.push((request.t_tot,), request)

    def _refresh(self, now: float) -> None:
        if self._keyed_at is not None and now - self._keyed_at < self.refresh_s:
            return
        self._keyed_at = now
        self._esg.drain()
        for request in _arrival_order(self._live.values()):
            self._esg.push((-esg_density(request, now),), request)

    def _head(self, now: float) -> QueuedRequest | None:
        """The next request, stale entries and lost fast-gate requests dropped on the way."""
        self._refresh(now)
        if (self._pops + 1) % self.fast_every == 0:
            while (head := self._fast.peek()) is not None and (
                    head.request_id not in self._live or _ttft_lost(head, now)):
                self._fast.pop()
            if head is not None:
                return head
        while (head := self._esg.peek()) is not None and head.request_id not in self._live:
            self._esg.pop()
        return head

    def pop(self, now: float) -> QueuedRequest:
        head = self._head(now)
        if head is None:
            raise IndexError("pop from an empty queue")
        self._pops += 1
        return self._live.pop(head.request_id)

    def peek(self, now: float) -> QueuedRequest | None:
        return self._head(now)

    def drain(self) -> list[QueuedRequest]:
        items = list(self._live.values())
        self._live, self._keyed_at, self._pops = {}, None, 0
        self._esg.drain()
        self._fast.drain()
        return items

    def __len__(self) -> int:
        return len(self._live)


class TwoLane(OrderingPolicy):
    """Fast and slow lanes split on T_tot <= ``threshold_s``. The gate serves the slow lane
    every ``slow_every``-th pop so long requests cannot starve.

    Deadlines act through a late queue rather than through the order inside a lane: a
    request that can no longer meet its TTFT even if dispatched now (a + SLO_ttft <
    now + t_ttft, i.e. its slack S = D - V_sys - T_tot of Eq. 5 is gone) leaves its lane
    for a late queue, served only when both lanes are empty: oldest first, or by the
    ``late`` policy given (``two_lane_esg``: ESG density, since a request that lost its
    TTFT has only its ESG left to earn, and that decays as 1 / TTLT). Inside a
    lane the order is shortest T_tot first, slack breaking ties: among requests that can
    all still make it, the shortest first is what makes the most of them make it, while
    slack order would spend an overloaded worker on the ones closest to being lost and
    lose the rest (full stack on 2400 requests of the Azure code trace at 12x in
    bench/slo.py's replay: 5.2 against 10.2 req/s of goodput). ``now`` only grows, so a
    late request stays late and the check is needed only at the head of each lane."""

    name = "two_lane"

    # Every 8th pop, not every 4th: on the Azure code trace a quarter of the dispatches
    # going to long requests cost 12% of the goodput under overload (bench/slo.py).
    def __init__(self, threshold_s: float = 2.0, slow_every: int = 8,
                 late: Callable[[], OrderingPolicy] | None = None) -> None:
        self.threshold_s = threshold_s
        self.slow_every = slow_every
        self._fast = _Heap()
        self._slow = _Heap()
        self._late = late() if late is not None else Fcfs()
        self.name = "two_lane" if late is None else f"two_lane_{self._late.name}"
        self._pops = 0

    def push(self, request: QueuedRequest, now: float) -> None:
        if _ttft_lost(request, now):
            self._late.push(request, now)
            return
        lane = self._fast if request.t_tot <= self.threshold_s else self._slow
        lane.push((request.t_tot, request.deadline - request.t_tot), request)

    def _settle(self, now: float) -> None:
        for lane in (self._fast, self._slow):
            while (head := lane.peek()) is not None and _ttft_lost(head, now):
                lane.pop()
                self._late.push(head, now)

    def _next_lane(self, now: float) -> _Heap | None:
        """The lane to serve next; None for the late queue."""
        self._settle(now)
        if not self._fast:
            return self._slow if self._slow else None
        gate_open = len(self._slow) > 0 and (self._pops + 1) % self.slow_every == 0
        return self._slow if gate_open else self._fast

    def pop(self, now: float) -> QueuedRequest:
        lane = self._next_lane(now)
        request = lane.pop()[1] if lane is not None else self._late.pop(now)
        self._pops += 1
        return request

    def peek(self, now: float) -> QueuedRequest | None:
        lane = self._next_lane(now)
        return lane.peek() if lane is not None else self._late.peek(now)

    def drain(self) -> list[QueuedRequest]:
        self._pops = 0
        return self._fast.drain() + self._slow.drain() + self._late.drain()

    def __len__(self) -> int:
        return len(self._fast) + len(self._slow) + len(self._late)


def _ttft_lost(request: QueuedRequest, now: float) -> bool:
    return now + request.ttft_pred_s > request.arrival_s + request.slo.ttft_s


PolicyFactory = Callable[[], OrderingPolicy]


class PolicyRegistry:
    """The pool Omega by name; the meta controller may only pick names registered here."""

    def __init__(self, factories: Mapping[str, PolicyFactory] | None = None) -> None:
        self._factories: dict[str, PolicyFactory] = dict(factories or {})

    def register(self, name: str, factory: PolicyFactory) -> None:
        self._factories[name] = factory

    def create(self, name: str) -> OrderingPolicy:
        if name not in self._factories:
            raise KeyError(f"no ordering policy named {name!r}")
        return self._factories[name]()

    def names(self) -> tuple[str, ...]:
        return tuple(sorted(self._factories))

    def __contains__(self, name: object) -> bool:
        return name in self._factories


def default_registry(
    tenant_weights: Mapping[str, float] | None = None, fast_lane_threshold_s: float = 2.0
) -> PolicyRegistry:
    weights = dict(tenant_weights or {})
    return PolicyRegistry(
        {
            "fcfs": Fcfs,
            "edf": Edf,
            "sjf": Sjf,
            "srtf": Srtf,
            "llf": Llf,
            "priority": StrictPriority,
            "mlfq": Mlfq,
            "wfq": lambda: Wfq(weights),
            "stride": lambda: Wfq(weights, unit_cost=True),
            "two_lane": lambda: TwoLane(fast_lane_threshold_s),
            "esg": EsgDensity,
            "two_lane_esg": lambda: TwoLane(fast_lane_threshold_s, late=EsgDensity),
            "esg_fast": EsgFastGate,
        }
    )


class RequestQueue:
    """The ready queue a worker's local controller pops from; its policy can be switched."""

    def __init__(self, policy: OrderingPolicy) -> None:
        self.policy = policy

    def push(self, request: QueuedRequest, now: float) -> None:
        self.policy.push(request, now)

    def pop(self, now: float) -> QueuedRequest:
        return self.policy.pop(now)

    def peek(self, now: float) -> QueuedRequest | None:
        return self.policy.peek(now)

    def __len__(self) -> int:
        return len(self.policy)


def switch(queue: RequestQueue, new_policy: OrderingPolicy, now: float) -> None:
    """Rebuild ``queue`` under ``new_policy`` in place: every queued request kept exactly once."""
    new_policy.rebuild(queue.policy.drain(), now)
    queue.policy = new_policy
