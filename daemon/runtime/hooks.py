"""The control policy's event hooks in the live daemon.

`on_instance_change(view, instance, now)` runs when an agent instance of a run starts,
is killed, stops or dies; `on_session_end(view, session, now)` when the last live run of
a session ends. Where the daemon learns of them:

- a run's sandbox posts its view every 0.25 s; `InstanceWatch.diff` compares it with
  the run's previous one: an instance that appears has `started` (the run's first view
  starts every instance it has), one that turns DRAINING was `killed`, one that turns
  DEAD or leaves the view has `stopped` (a killed instance drains and then goes);
- when a run ends, each instance it still had has `stopped` (the run finished) or
  `died` (it failed or was cancelled: its sandbox is gone), and its session has ended
  unless another live run shares it.

The view a hook sees is the joined view of the live runs at the time it runs (names
`<run>/<name>`, as the periodic step sees them): an instance that is gone is not in it.

None of this is on a call's path: the report handler and the run's end only queue the
hook calls; one task takes what is queued, runs the calls as one guarded batch on a
thread of its own (`ControlGuard.run`: an exception rolls the version back, as in the
periodic step) and queues the decisions for their runs. Every hook call is a
`control.hook` trace event of the run it concerns, with the policy and its version and
every decision the hook returned (each `ok` or refused with its reason), so what a
policy made of an event is readable in the session's trace.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from scheduling.agents.policy import (
    ControlStep,
    ControlView,
    GlobalController,
    InstanceState,
    decision_to_dict,
)

if TYPE_CHECKING:
    from daemon.runtime.global_controller import ControlLoop
    from daemon.runtime.runs import Run

log = logging.getLogger("agentd.instances")

INSTANCE, SESSION = "on_instance_change", "on_session_end"
_CHANGE = {InstanceState.DRAINING: "killed", InstanceState.DEAD: "stopped",
           InstanceState.ACTIVE: "active"}


@dataclass(frozen=True)
class HookCall:
    hook: str  # INSTANCE or SESSION
    run_id: str  # the run whose trace records it
    subject: str  # the instance in the joined view's names, or the session
    change: str  # started | active | killed | stopped | died | ended


@dataclass
class InstanceWatch:
    """Each live run's instances and their states, as of its last view."""

    known: dict[str, dict[str, InstanceState]] = field(default_factory=dict)

    def diff(self, run_id: str, view: ControlView) -> list[tuple[str, str]]:
        """(instance, change) between the run's previous view and this one."""
        before = self.known.get(run_id, {})
        now = {i.instance_id: i.state for i in view.instances}
        self.known[run_id] = now
        changes = [(i, "started") for i in now if i not in before]
        changes += [(i, _CHANGE[s]) for i, s in now.items()
                    if i in before and before[i] is not s and s in _CHANGE]
        changes += [(i, "stopped") for i, s in before.items()
                    if i not in now and s is not InstanceState.DEAD]
        return changes

    def ended(self, run_id: str, change: str) -> list[tuple[str, str]]:
        """Every instance the run still had, with `change`; forgets the run."""
        return [(i, change) for i, s in self.known.pop(run_id, {}).items()
                if s is not InstanceState.DEAD]


class HookRunner:
    """Queues hook calls and runs them, batched, off the event loop."""

    def __init__(self, loop: ControlLoop) -> None:
        self.loop = loop
        self.watch = InstanceWatch()
        self.pending: list[HookCall] = []
        self.calls_run = 0
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    # --- where events come from ---------------------------------------------------------

    def reported(self, run: Run, view: ControlView) -> None:
        for instance, change in self.watch.diff(run.id, view):
            self._queue(HookCall(INSTANCE, run.id, f"{run.id}/{instance}", change))

    def run_ended(self, run: Run) -> None:
        change = "stopped" if run.status == "finished" else "died"
        for instance, how in self.watch.ended(run.id, change):
            self._queue(HookCall(INSTANCE, run.id, f"{run.id}/{instance}", how))
        others = [r for r in self.loop.runs.runs.values()
                  if r.session_id == run.session_id and not r.ended]
        if not others:
            self._queue(HookCall(SESSION, run.id, run.session_id, "ended"))

    def _queue(self, call: HookCall) -> None:
        self.pending.append(call)
        self._wake.set()

    # --- running them -------------------------------------------------------------------

    def start(self) -> None:
        self._task = asyncio.create_task(self._serve(), name="control-hooks")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _serve(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            batch, self.pending = self.pending, []
            try:
                await self.run(batch)
            except Exception:
                log.exception("control hooks failed for %d event(s)", len(batch))

    async def run(self, batch: list[HookCall]) -> None:
        if not batch:
            return
        async with self.loop.stepping:
            live = self.loop.live()
            view = self.loop.joined(live)
            now = time.time()

            def body(gc: GlobalController) -> list[ControlStep]:
                return [gc.instance_changed(view, c.subject, now) if c.hook == INSTANCE
                        else gc.session_ended(view, c.subject, now) for c in batch]

            t0 = time.perf_counter()
            active, steps = await self.loop.guard.run(body, now, len(batch))
            ms = (time.perf_counter() - t0) * 1e3
        self.calls_run += len(batch)
        for call, step in zip(batch, steps, strict=True):
            self._trace(call, step, active.name, active.version, ms / len(batch))
            self.loop.queue_step(step, live, active)

    def _trace(self, call: HookCall, step: ControlStep, policy: str, version: int,
               ms: float) -> None:
        run = self.loop.runs.runs.get(call.run_id)
        if run is None:
            return
        decisions: list[dict[str, Any]] = [
            {**decision_to_dict(d), "ok": True} for d in step.accepted]
        decisions += [{**decision_to_dict(r.decision), "ok": False, "refused": r.reason}
                      for r in step.rejected]
        subject = {"instance": call.subject} if call.hook == INSTANCE else {
            "session": call.subject}
        self.loop.runs.trace(run, "control.hook", hook=call.hook, change=call.change,
                             policy=policy, policy_version=version, decisions=decisions,
                             duration_ms=round(ms, 3), **subject)
