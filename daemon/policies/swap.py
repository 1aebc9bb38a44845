"""A layer's active policy, swappable between ticks, with automatic rollback.

`Guard` holds one layer's active version and makes every call to it through `call`.
If that version raises (at any time) or runs over its budget during the probation
window after activation, the previous version takes over at once and answers the same
call, so the daemon keeps scheduling. `on_failure` tells the registry, which records it
and updates the store. `on_change` runs whenever another version takes over (a swap, an
operator's rollback, an automatic one): a layer whose policy holds state, like the
ordering layer's queue, rebuilds the incoming version there from the daemon's own record.

Swapping is a plain attribute assignment on the event loop thread. The daemon calls
policies synchronously from the loop, so an activation always lands between two calls.

`GuardedKvPolicy` is the kv layer's guard and what `KvControl.policy` holds; the kv layer
keeps no state between calls (everything is in the view), so queued and paused programs
carry over unchanged.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from daemon.policies.clock import cpu_time
from daemon.policies.deadline import deadline
from scheduling.kv import Decision, KvPolicy, KvView

log = logging.getLogger("agentd.policies")
T = TypeVar("T")

PROBATION_S = 30.0
# Live calls run on a busy event loop; the budget is wider than the dry run's 5 ms so
# that a GC pause does not roll back a sound policy. A call past HARD_LIMIT_S of wall
# time is interrupted (see validate.deadline).
RUNTIME_BUDGET_S = 0.025
HARD_LIMIT_S = 0.5
FAILURES_TO_RETIRE = 3
# Versions kept to fall back to; the meta controller's switches push here too.
HISTORY = 16


@dataclass(frozen=True)
class Active:
    name: str
    version: int
    policy: Any
    activated_at: float = field(default_factory=time.monotonic)


@dataclass(frozen=True)
class Failure:
    failed: Active
    restored: Active
    reason: str
    layer: str = "kv"


class Guard:
    """Delegates to the active version; rolls back to the previous one on failure."""

    def __init__(self, active: Active, on_failure: Callable[[Failure], None] | None = None,
                 probation_s: float = PROBATION_S, budget_s: float = RUNTIME_BUDGET_S,
                 layer: str = "kv", on_change: Callable[[Active], None] | None = None) -> None:
        self.current = active
        self.previous: list[Active] = []
        self.on_failure = on_failure
        self.on_change = on_change
        self.probation_s = probation_s
        self.budget_s = budget_s
        self.layer = layer

    @property
    def name(self) -> str:
        return self.current.name

    @property
    def version(self) -> int:
        return self.current.version

    def swap(self, active: Active) -> float:
        """Make `active` current; returns how long the swap took in seconds."""
        start = time.perf_counter()
        self.previous.append(self.current)
        del self.previous[:-HISTORY]
        self._set(active)
        return time.perf_counter() - start

    def restore_previous(self) -> Active | None:
        """Drop the current version for the one before it (an operator's rollback)."""
        if not self.previous:
            return None
        self._set(self.previous.pop())
        return self.current

    def reset(self, active: Active) -> None:
        """Put `active` in charge without keeping the current version to fall back to."""
        self._set(active)

    def in_probation(self) -> bool:
        return time.monotonic() - self.current.activated_at < self.probation_s

    def call(self, fn: Callable[[Any], T], budget_s: float | None = None) -> T:
        """`fn(active policy)`, falling back version by version while one fails."""
        active = self.current
        if not self.previous:
            return fn(active.policy)  # nothing to fall back to: behave as before
        probation = self.in_probation()
        budget = self.budget_s if budget_s is None else budget_s
        # CPU time of this thread, not wall time: on a busy machine the daemon can be
        # descheduled mid-call, which says nothing about the policy.
        start = cpu_time()
        try:
            with deadline(max(HARD_LIMIT_S, 2 * budget) if probation else 0):
                result = fn(active.policy)
        except Exception as exc:
            self._fail(active, f"raised {type(exc).__name__}: {exc}")
            return self.call(fn, budget_s)
        elapsed = cpu_time() - start
        if probation and elapsed > budget:
            self._fail(active, f"a call took {elapsed * 1000:.1f} ms of CPU during probation; "
                               f"the budget is {budget * 1000:.1f} ms")
            return self.call(fn, budget_s)
        return result

    def reject(self, reason: str) -> None:
        """The caller found the active version broke its contract (lost or invented
        work): roll back, or with nothing to fall back to rebuild it in place."""
        if self.previous:
            self._fail(self.current, reason)
        else:
            log.error("%s policy %s v%d misbehaved with nothing to fall back to: %s",
                      self.layer, self.current.name, self.current.version, reason)
            self._set(self.current)

    def _set(self, active: Active) -> None:
        self.current = active
        if self.on_change is not None:
            self.on_change(active)

    def _fail(self, failed: Active, reason: str) -> None:
        restored = self.previous.pop()
        log.warning("%s policy %s v%d rolled back to %s v%d: %s", self.layer, failed.name,
                    failed.version, restored.name, restored.version, reason)
        self._set(restored)
        if self.on_failure is not None:
            self.on_failure(Failure(failed, restored, reason, self.layer))


class GuardedKvPolicy(Guard, KvPolicy):
    """The kv layer's guard, itself a KvPolicy, so KvControl calls it as any other."""

    def decide(self, view: KvView, now: float) -> list[Decision]:
        return self.call(lambda p: p.decide(view, now))

    def route(self, view: KvView, program_id: str, now: float) -> str | None:
        worker: str | None = self.call(lambda p: p.route(view, program_id, now))
        return worker

    def on_request_end(self, view: KvView, program_id: str, now: float) -> list[Decision]:
        return self.call(lambda p: p.on_request_end(view, program_id, now))
