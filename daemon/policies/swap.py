"""The active kv policy, swappable between ticks, with automatic rollback.

`GuardedKvPolicy` is what `KvControl.policy` holds. Every call goes to the active
version; if that version raises (at any time) or runs over its budget during the
probation window after activation, the previous version takes over at once and
answers the same call, so the tick still gets decisions and the daemon keeps
scheduling. `on_failure` tells the registry, which records it and updates the store.

Swapping is a plain attribute assignment on the event loop thread. KvControl calls
the policy synchronously from the loop, so an activation always lands between two
calls; the kv layer keeps no state between calls (everything is in the view), so
queued and paused programs carry over unchanged.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from daemon.policies.validate import deadline
from scheduling.kv import Decision, KvPolicy, KvView

log = logging.getLogger("agentd.policies")
T = TypeVar("T")

PROBATION_S = 30.0
# Live calls run on a busy event loop; the budget is wider than the dry run's 5 ms so
# that a GC pause under load does not roll back a sound policy.
RUNTIME_BUDGET_S = 0.025
HARD_LIMIT_S = 0.5
FAILURES_TO_RETIRE = 3


@dataclass(frozen=True)
class Active:
    name: str
    version: int
    policy: KvPolicy
    activated_at: float = field(default_factory=time.monotonic)


@dataclass(frozen=True)
class Failure:
    failed: Active
    restored: Active
    reason: str


class GuardedKvPolicy(KvPolicy):
    """Delegates to the active version; rolls back to the previous one on failure."""

    def __init__(self, active: Active, on_failure: Callable[[Failure], None] | None = None,
                 probation_s: float = PROBATION_S, budget_s: float = RUNTIME_BUDGET_S) -> None:
        self.current = active
        self.previous: list[Active] = []
        self.on_failure = on_failure
        self.probation_s = probation_s
        self.budget_s = budget_s

    def __getattr__(self, attr: str) -> Any:
        # KvPolicy declares `name` without a value; trace events read it from here.
        if attr == "name":
            return self.__dict__["current"].name
        raise AttributeError(attr)

    @property
    def version(self) -> int:
        return self.current.version

    def swap(self, active: Active) -> float:
        """Make `active` current; returns how long the swap took in seconds."""
        start = time.perf_counter()
        self.previous.append(self.current)
        self.current = active
        return time.perf_counter() - start

    def restore_previous(self) -> Active | None:
        """Drop the current version for the one before it (an operator's rollback)."""
        if not self.previous:
            return None
        self.current = self.previous.pop()
        return self.current

    def in_probation(self) -> bool:
        return time.monotonic() - self.current.activated_at < self.probation_s

    # --- the interface --------------------------------------------------------------

    def decide(self, view: KvView, now: float) -> list[Decision]:
        return self._call(lambda p: p.decide(view, now))

    def route(self, view: KvView, program_id: str, now: float) -> str | None:
        return self._call(lambda p: p.route(view, program_id, now))

    def on_request_end(self, view: KvView, program_id: str, now: float) -> list[Decision]:
        return self._call(lambda p: p.on_request_end(view, program_id, now))

    def _call(self, fn: Callable[[KvPolicy], T]) -> T:
        active = self.current
        if not self.previous:
            return fn(active.policy)  # nothing to fall back to: behave as before
        probation = self.in_probation()
        start = time.perf_counter()
        try:
            with deadline(HARD_LIMIT_S if probation else 0):
                result = fn(active.policy)
        except Exception as exc:
            self._fail(active, f"raised {type(exc).__name__}: {exc}")
            return self._call(fn)
        elapsed = time.perf_counter() - start
        if probation and elapsed > self.budget_s:
            self._fail(active, f"a call took {elapsed * 1000:.1f} ms during probation; "
                               f"the budget is {self.budget_s * 1000:.1f} ms")
            return self._call(fn)
        return result

    def _fail(self, failed: Active, reason: str) -> None:
        restored = self.previous.pop()
        self.current = restored
        log.warning("kv policy %s v%d rolled back to %s v%d: %s", failed.name, failed.version,
                    restored.name, restored.version, reason)
        if self.on_failure is not None:
            self.on_failure(Failure(failed, restored, reason))
