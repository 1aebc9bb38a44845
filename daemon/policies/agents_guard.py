"""The control layer's guard: one global-controller step (or a batch of hook calls),
run off the event loop and judged on it.

A step over the whole view can take far longer than a dispatch may wait, so the active
version runs on a thread of its own; its outcome comes back to the event loop, where
the judgement and any rollback happen (the registry's failure hook and every swap live
on the loop thread, so no lock is needed). The rules are `Guard`'s: an exception at any
time, or during probation a step over its CPU budget (half the policy's period: the
loop must keep its period) or one whose decisions the view refuses, puts the previous
version back, and that version runs the same step at once. A step still running after
`hard_limit_s` is interrupted (PolicyTimeout raised in its thread) and counts as raising.

Swaps land between two steps: a step already running finishes under the version that
started it; if that version has meanwhile been replaced its failure is not held against
the new one.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

from daemon.policies.agents_layer import period_of
from daemon.policies.clock import cpu_time
from daemon.policies.deadline import PolicyTimeout
from daemon.policies.swap import PROBATION_S, Active, Failure, Guard
from scheduling.agents.policy import ControlPolicy, ControlStep, ControlView, GlobalController

log = logging.getLogger("agentd.instances")

BUDGET_SHARE = 0.5  # of the period, in CPU seconds, during probation
MIN_HARD_LIMIT_S = 1.0
HARD_LIMIT_PERIODS = 4.0


@dataclass(frozen=True)
class Outcome:
    steps: list[ControlStep] | None
    error: BaseException | None
    cpu_s: float


# One guarded call: the periodic step, or a batch of hook calls, one ControlStep each.
Body = Callable[[GlobalController], list[ControlStep]]


class ControlGuard(Guard):
    def __init__(self, active: Active, on_failure: Callable[[Failure], None] | None = None,
                 probation_s: float = PROBATION_S) -> None:
        super().__init__(active, on_failure, probation_s, layer="control")

    @property
    def period_s(self) -> float:
        return period_of(self.current.policy)

    def budget_for(self, policy: ControlPolicy) -> float:
        return BUDGET_SHARE * period_of(policy)

    def hard_limit_for(self, policy: ControlPolicy) -> float:
        return max(MIN_HARD_LIMIT_S, HARD_LIMIT_PERIODS * period_of(policy))

    async def step(self, view: ControlView, now: float) -> tuple[Active, ControlStep]:
        """The active version's step, falling back version by version while one fails.
        With nothing to fall back to, an exception propagates (the loop logs it and
        tries again next period) and any other step is used as it is."""
        active, steps = await self.run(lambda gc: [gc.step(view, now)], now)
        return active, steps[0]

    async def run(self, body: Body, now: float, calls: int = 1
                  ) -> tuple[Active, list[ControlStep]]:
        """`body` (`calls` policy calls, e.g. hooks) under the same rules as a step; the
        CPU budget during probation is the step's per call."""
        while True:
            active = self.current
            outcome = await run_body(active.policy, body, self.hard_limit_for(active.policy))
            problem = self._problem(active, outcome, calls)
            if problem is None:
                assert outcome.steps is not None
                return active, outcome.steps
            if active is not self.current:
                log.warning("control policy %s v%d failed after it was replaced: %s",
                            active.name, active.version, problem)
                return active, [ControlStep(active.name, now, (), ())] * calls
            if not self.previous:
                if outcome.error is not None:
                    raise outcome.error
                assert outcome.steps is not None
                log.error("control policy %s v%d misbehaved with nothing to fall back to: %s",
                          active.name, active.version, problem)
                return active, outcome.steps
            self._fail(active, problem)

    def _problem(self, active: Active, outcome: Outcome, calls: int = 1) -> str | None:
        if outcome.error is not None:
            return f"raised {type(outcome.error).__name__}: {outcome.error}"
        if not self.in_probation():
            return None
        assert outcome.steps is not None
        budget = self.budget_for(active.policy) * calls
        if outcome.cpu_s > budget:
            what = "a step" if calls == 1 else f"{calls} calls"
            return (f"{what} took {outcome.cpu_s * 1000:.1f} ms of CPU during probation; the "
                    f"budget is {budget * 1000:.1f} ms (half its period per call)")
        rejected = [r for step in outcome.steps for r in step.rejected]
        if rejected:
            first = rejected[0]
            return (f"{len(rejected)} decision(s) refused during probation, "
                    f"first {first.decision!r}: {first.reason}")
        return None


async def run_body(policy: ControlPolicy, body: Body, limit_s: float) -> Outcome:
    """`body(GlobalController(policy))` on a thread of its own, timed in CPU seconds less
    garbage collection (daemon/policies/clock.py)."""
    loop = asyncio.get_running_loop()
    result: asyncio.Future[Outcome] = loop.create_future()
    finished = threading.Lock()
    state = {"done": False}

    def deliver(outcome: Outcome) -> None:
        if not result.done():
            result.set_result(outcome)

    def work() -> None:
        outcome = Outcome(None, PolicyTimeout(f"still running after {limit_s:.1f} s"), 0.0)
        try:
            start = cpu_time()
            try:
                steps = body(GlobalController(policy))
                outcome = Outcome(steps, None, cpu_time() - start)
            except Exception as exc:
                outcome = Outcome(None, exc, cpu_time() - start)
            with finished:
                state["done"] = True
        except PolicyTimeout:
            pass  # interrupted between the step and being marked done: reported already
        with contextlib.suppress(RuntimeError):  # the loop closed: the daemon is stopping
            loop.call_soon_threadsafe(deliver, outcome)

    thread = threading.Thread(target=work, name="control-step", daemon=True)
    thread.start()
    try:
        return await asyncio.wait_for(asyncio.shield(result), limit_s)
    except TimeoutError:
        with finished:
            if not state["done"] and thread.ident is not None:
                _interrupt(thread.ident)
        return Outcome(None, PolicyTimeout(f"still running after {limit_s:.1f} s"), limit_s)


def _interrupt(thread_id: int) -> None:
    """Raise PolicyTimeout in the thread at its next bytecode (code stuck inside one C
    call is not interrupted; the thread is a daemon thread, so it never holds up exit)."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id),
                                               ctypes.py_object(PolicyTimeout))
