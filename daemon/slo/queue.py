"""The daemon's global waiting queue: an ordered part under the active ordering policy,
and a parked part for requests whose program the KV policy is holding.

The ordering policy (scheduling/slo/ordering.py, or an operator's) decides the order; the
daemon keeps its own record, `live`, of which requests are in the ordered part, so that

- a switch rebuilds the incoming policy from `live` in place, between two dispatches:
  nothing is dropped or duplicated, whatever the outgoing policy's state;
- a policy that raises, runs over its budget, loses requests or invents them is rolled
  back by its `Guard`, and the restored version is rebuilt from `live` the same way;
- an aborted request leaves `live` at once; its entry in the policy is skipped when it
  comes up (lazy deletion: O(1) instead of a rebuild per abort).

`live` changes only after a policy call succeeded, so a call the guard retries on the
restored version takes effect once.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping

from daemon.policies.swap import RUNTIME_BUDGET_S, Active, Failure, Guard
from scheduling.slo.ordering import Wfq
from scheduling.slo.prediction import QueuedRequest

# Rebuilding is O(n log n); its budget grows with the queue so a long queue does not
# make a sound policy look slow.
REBUILD_BUDGET_PER_REQUEST_S = 20e-6
log = logging.getLogger("agentd.slo")


class OrderedQueue:
    def __init__(self, active: Active, on_failure: Callable[[Failure], None] | None = None,
                 clock: Callable[[], float] = time.time,
                 tune: Callable[[Active], None] | None = None) -> None:
        self.live: dict[str, QueuedRequest] = {}
        self._stale = 0  # entries the policy still holds for requests no longer queued
        self.clock = clock
        # Configures a version as it takes over, before it orders anything (tenant weights).
        self.tune = tune
        self.guard = Guard(active, on_failure, layer="ordering", on_change=self._rebuild)
        # Told which version runs after every rebuild (a swap or a rollback).
        self.on_switched: Callable[[Active], None] | None = None

    def __len__(self) -> int:
        return len(self.live)

    def __iter__(self) -> Iterator[str]:
        return iter(list(self.live))

    def __contains__(self, request_id: object) -> bool:
        return request_id in self.live

    @property
    def policy_name(self) -> str:
        return self.guard.name

    def switch(self, active: Active) -> float:
        """Put `active` in charge, rebuilt from the queued requests; returns seconds taken."""
        return self.guard.swap(active)

    def push(self, request: QueuedRequest, now: float) -> None:
        self.guard.call(lambda p: p.push(request, now))
        self.live[request.request_id] = request

    def discard(self, request_id: str) -> QueuedRequest | None:
        found = self.live.pop(request_id, None)
        if found is not None:
            self._stale += 1  # its entry stays in the policy until it comes up
        return found

    def peek(self, now: float) -> QueuedRequest | None:
        """The next live request in policy order, dropping entries no longer queued."""
        for _ in range(3):
            head = self._peek_live(now)
            if not isinstance(head, str):
                if head is not None or not self.live:
                    return head
                head = f"peek found no request while {len(self.live)} are queued"
            self.guard.reject(head)
        log.error("ordering policy %s keeps failing; %d queued requests wait",
                  self.guard.name, len(self.live))
        return None

    def _peek_live(self, now: float) -> QueuedRequest | str | None:
        """The head, None when empty, or what is wrong with the policy."""
        while True:
            head = self.guard.call(lambda p: p.peek(now))
            if head is None:
                return None
            if not isinstance(head, QueuedRequest):
                return f"peek returned {_describe(head)}, not a QueuedRequest"
            if head.request_id in self.live:
                return head
            if self._stale <= 0:
                return f"peek returned {head.request_id}, which is not queued"
            before = self.guard.current
            popped = self.guard.call(lambda p: p.pop(now))
            if self.guard.current is not before:
                self._rebuild(self.guard.current)  # rolled back mid-call: restore what it took
            elif getattr(popped, "request_id", None) != head.request_id:
                return f"pop returned {_describe(popped)}, not {head.request_id}"
            else:
                self._stale -= 1

    def take(self, head: QueuedRequest, now: float) -> bool:
        """Pop `head` (what `peek` just returned). False when the policy popped another
        request; the queue is then rebuilt and the caller should peek again."""
        before = self.guard.current
        popped = self.guard.call(lambda p: p.pop(now))
        if getattr(popped, "request_id", None) == head.request_id:
            del self.live[head.request_id]
            return True
        if self.guard.current is before:
            self.guard.reject(f"pop returned {_describe(popped)}, not the request peek returned "
                              f"({head.request_id})")
        else:
            self._rebuild(self.guard.current)  # rolled back mid-call: restore what it took
        return False

    def snapshot(self, limit: int) -> list[QueuedRequest]:
        return list(self.live.values())[:limit]

    def _rebuild(self, active: Active) -> None:
        if self.tune is not None:
            self.tune(active)
        items = list(self.live.values())
        self._stale = 0
        budget = max(RUNTIME_BUDGET_S, REBUILD_BUDGET_PER_REQUEST_S * len(items))
        now = self.clock()
        self.guard.call(lambda p: p.rebuild(items, now), budget)
        if self.on_switched is not None:
            self.on_switched(self.guard.current)


def weigh_tenants(weights: Mapping[str, float]) -> Callable[[Active], None]:
    """An OrderedQueue `tune` that gives the built-in WFQ/stride the configured tenant
    weights as it takes over (an operator's own version keeps what it was written with)."""
    def weigh(active: Active) -> None:
        if active.version == 1 and type(active.policy) is Wfq:
            active.policy.weights = dict(weights)
    return weigh


def _describe(value: object) -> str:
    rid = getattr(value, "request_id", None)
    return repr(rid) if rid is not None else f"a {type(value).__name__}"


class WaitingQueue:
    """Both parts of the global queue; `len` and iteration cover every waiting request."""

    def __init__(self, ordered: OrderedQueue) -> None:
        self.ordered = ordered
        self.parked: deque[str] = deque()

    def __len__(self) -> int:
        return len(self.ordered) + len(self.parked)

    def __iter__(self) -> Iterator[str]:
        yield from self.parked
        yield from self.ordered
