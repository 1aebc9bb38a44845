"""Applies the program-aware KV policy (scheduling/kv) to the daemon's live state.

The policy is pure: it reads a `KvView` built here and returns decisions. This
module builds the view from the core's programs and workers, applies decisions
(status changes, dispatching a restored program's pending request, aborting a
request an operator moved with now=true) and records each one in the trace.

Tools agentd runs for a program (see scheduling/kv/tool_clock.py) feed the view: while one
runs the program is ACTING from the tool's start, and measured tool durations replace
request gaps as its tool-time history.

Whether a paused program's blocks are still cached comes from the engine's KV cache events,
or, for an engine without them, an estimate from token counts (daemon/kv/residency.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from daemon.kv.residency import KvResidency
from daemon.state import (
    Host,
    ProgramState,
    ProgramStatus,
    RequestState,
    WorkerState,
    prompt_estimate,
)
from scheduling.kv import (
    Admit,
    Decision,
    KvConfig,
    KvPolicy,
    KvView,
    MarkPauseAfterRequest,
    MigrationPlan,
    Pause,
    ProgramView,
    Restore,
    WorkerView,
    make_kv_policy,
    plan_migration,
)
from scheduling.kv import ProgramStatus as KvStatus
from scheduling.kv.tool_clock import ToolClock, ToolClocks

_TO_KV = {
    ProgramStatus.QUEUED: KvStatus.QUEUED, ProgramStatus.REASONING: KvStatus.REASONING,
    ProgramStatus.ACTING: KvStatus.ACTING, ProgramStatus.PAUSED: KvStatus.PAUSED,
}


class KvControl:
    def __init__(self, core: Host, policy_name: str, config: KvConfig | None = None,
                 options: Mapping[str, Any] | None = None, residency: str = "events") -> None:
        self.core = core
        self.policy: KvPolicy = make_kv_policy(policy_name, options)
        self.config = config or KvConfig()
        self.tools = ToolClocks()
        self.residency = KvResidency(residency)
        self._registered: dict[str, float] = {}
        self._views = ProgramViews(self.tools, self.residency)
        # One dispatch step routes request after request (every parked one, then queue
        # heads until the workers fill) against the same state: within a step the view is
        # built once, and again only after the step applied a decision (the core's pump
        # opens and closes the step). Building it for each route was O(live programs)
        # times the requests waiting, on every pump.
        self._step_open = False
        self._step_view: KvView | None = None

    # --- the view ---------------------------------------------------------------

    def view(self) -> KvView:
        self._note_restarts()
        workers = tuple(
            WorkerView(w.id, w.kv_capacity_tokens,
                       w.stats.kv_used_tokens if w.stats else 0, w.healthy, node=w.node)
            for w in self.core.workers.values()
        )
        programs = self._views.build(self.core.programs.values(), self.core.workers,
                                     self.core.requests)
        return KvView(workers, programs, self.config)

    def _note_restarts(self) -> None:
        # A worker registering again under its id comes back with an empty cache.
        for w in self.core.workers.values():
            if self._registered.setdefault(w.id, w.registered_at) != w.registered_at:
                self._registered[w.id] = w.registered_at
                self.residency.worker_reset(w.id)

    def request_hit(self, req: RequestState) -> None:
        self.residency.request_hit(req)

    def request_wrote(self, req: RequestState) -> None:
        """A request that ran on a worker ended and freed its blocks there."""
        worker = self.core.workers.get(req.worker_id) if req.worker_id else None
        if worker is not None:
            self.residency.request_ended(req, worker)

    def residency_of(self, program: ProgramState) -> dict[str, Any] | None:
        """What the daemon knows of the program's blocks on its (last) worker, for the API:
        where it comes from, resident or not, and, from the engine's events, how many
        tokens of its last context are cached there (and in a lower tier)."""
        worker = self.core.workers.get(program.worker_id) if program.worker_id else None
        if worker is None:
            return None
        resident, _ = self.residency.of(program.id, worker)
        report = (worker.residency.get(program.id)
                  if self.residency.source(worker) == "events" else None)
        out: dict[str, Any] = {"worker_id": worker.id, "resident": resident,
                               "source": "estimate" if report is None else "events"}
        if report is not None:
            out.update(context_tokens=report.context_tokens, cached_tokens=report.cached_tokens,
                       reachable_tokens=report.reachable_tokens)
        return out

    def begin_step(self) -> None:
        self._step_open, self._step_view = True, None

    def step_changed(self) -> None:
        """The step applied a decision: the next route sees a fresh view."""
        self._step_view = None

    def end_step(self) -> None:
        self._step_open, self._step_view = False, None

    # --- calls into the policy --------------------------------------------------

    def route(self, program: ProgramState, now: float | None = None) -> str | None:
        """`now`: the dispatch step's, so every request it routes sees the same time."""
        if program.held:
            return None
        now = self.core.clock() if now is None else now
        view = self._step_view
        if view is None:
            view = self.view()
            if self._step_open:
                self._step_view = view
        worker_id = self.policy.route(view, program.id, now)
        if worker_id is not None and program.status in (ProgramStatus.QUEUED, ProgramStatus.PAUSED):
            kind = Admit if program.status == ProgramStatus.QUEUED else Restore
            self._record(kind(program.id, worker_id, "routed"), program)
        return worker_id

    def tick(self) -> None:
        self.apply(self.policy.decide(self.view(), self.core.clock()))
        self._views.forget_gone(self.core.programs)
        self.residency.forget_except(self.core.programs, self.core.workers)
        self.tools.forget_except(self.core.programs)

    def tool_started(self, program_id: str, now: float) -> None:
        """agentd started running a tool for the program (a call waiting for its
        environment counts: the program is away from the GPU either way)."""
        self.tools.started(program_id, now)

    def tool_ended(self, program_id: str, now: float) -> float | None:
        """Returns the measured span when no other tool of the program still runs."""
        return self.tools.ended(program_id, now)

    def request_ended(self, program: ProgramState) -> None:
        if program.held and program.worker_id is not None:
            self.apply([Pause(program.id, program.worker_id, "paused by an operator")])
            return
        self.apply(self.policy.on_request_end(self.view(), program.id, self.core.clock()))

    def migrate(self, program: ProgramState, target: str, now: bool, by: str) -> MigrationPlan:
        program.held = False
        plan = plan_migration(self.view(), program.id, target, now=now)
        source = program.worker_id
        self.apply(list(plan.decisions))
        program.pinned = True
        self.core.writer.trace(
            "program.migrated", session_id=program.session_id, program_id=program.id,
            worker_id=target, source=source, target=target, now=now, by=by,
            recompute_tokens=plan.recompute_tokens,
        )
        return plan

    # --- applying decisions -------------------------------------------------------

    def apply(self, decisions: list[Decision]) -> None:
        for decision in decisions:
            program = self.core.programs.get(decision.program_id)
            if program is None or program.status not in _TO_KV:
                continue
            if isinstance(decision, MarkPauseAfterRequest):
                program.pause_marked = True
                program.migrate_to = decision.restore_on
            elif isinstance(decision, Pause):
                self._pause(program, decision)
            else:
                grant = (decision.worker_id, program.ready_request)
                repeated = program.kv_grant == grant and program.worker_id == decision.worker_id
                program.worker_id = decision.worker_id
                program.pause_marked = False
                program.migrate_to = None
                program.kv_grant = grant
                if program.ready_request is None:
                    self.core.set_program_status(program, ProgramStatus.ACTING, decision.reason)
                if repeated:
                    continue
            self._record(decision, program)
        if decisions:
            self.core.pump()

    def _pause(self, program: ProgramState, decision: Pause) -> None:
        if program.active_request is not None and program.status == ProgramStatus.REASONING:
            self.core.requeue(program.active_request, f"paused: {decision.reason}")
        program.pause_marked = False
        program.kv_grant = None
        self.core.set_program_status(program, ProgramStatus.PAUSED, decision.reason)

    def _record(self, decision: Decision, program: ProgramState) -> None:
        kind = {Pause: "kv.pause", MarkPauseAfterRequest: "kv.mark_pause",
                Restore: "kv.restore", Admit: "kv.admit"}[type(decision)]
        worker = getattr(decision, "worker_id", None) or getattr(decision, "restore_on", None)
        self.core.writer.trace(
            kind, session_id=program.session_id, program_id=program.id, worker_id=worker,
            reason=decision.reason, context_tokens=program.context_tokens,
            policy=self.policy.name, policy_version=getattr(self.policy, "version", None),
        )


# A program's context with its ready or running request, its tool clock's key, and (paused)
# its residency on its worker.
_Outside = tuple[int, tuple[object, ...] | None, tuple[bool | None, int | None]]


class ProgramViews:
    """Each program's `ProgramView`, rebuilt only when something it is built from changed.

    The view is rebuilt for every routed request and every ended one; with thousands of
    live programs (a chat request without a program_id holds its program for
    `lineage_idle_s`) that loop is most of the daemon's CPU per request, and between two
    routings almost none of them changes. A program's own fields are covered by its
    `revision` (bumped by every assignment), so an idle program costs a lookup and two
    comparisons; what lives outside it (its ready or running request's tokens, a tool
    clock, a paused program's residency on its worker) is compared as well, for the few
    programs that have one. A cached view always equals a fresh one.
    """

    def __init__(self, tools: ToolClocks | None = None,
                 residency: KvResidency | None = None) -> None:
        # program id -> (the program, its revision, what of its view lives outside it, the view)
        self._cache: dict[str, tuple[ProgramState, int, _Outside | None, ProgramView]] = {}
        self._tools = tools or ToolClocks()
        self._residency = residency or KvResidency()

    def build(self, programs: Iterable[ProgramState],
              workers: Mapping[str, WorkerState] | None = None,
              requests: Mapping[str, RequestState] | None = None) -> tuple[ProgramView, ...]:
        """`workers`: for a paused program's residency on its worker; `requests`: the
        program's ready or running request, whose tokens its KV must hold."""
        out = []
        cache = self._cache
        # No tool clock at all (no tool agentd runs): no lookup per program.
        clock_of = self._tools.get if self._tools.count() else None
        paused = ProgramStatus.PAUSED
        for p in programs:
            clock = clock_of(p.id) if clock_of is not None else None
            hit = cache.get(p.id)
            # Unchanged since its view was built (so not held, not ended either), and with
            # nothing outside it: the common case, kept to the fewest operations.
            if (hit is not None and hit[0] is p and hit[1] == p.revision and hit[2] is None
                    and clock is None):
                out.append(hit[3])
                continue
            if p.held or p.status not in _TO_KV:
                continue
            outside: _Outside | None = None
            if clock is not None or p.status is paused or p.ready_request or p.active_request:
                outside = self._outside(p, clock, workers, requests)
            if hit is None or hit[0] is not p or hit[1] != p.revision or hit[2] != outside:
                if outside is None:
                    view = _program_view(p)
                else:
                    context, _, resident = outside
                    view = _program_view(p, clock, *resident, context=context)
                hit = cache[p.id] = (p, p.revision, outside, view)
            out.append(hit[3])
        return tuple(out)

    def _outside(self, p: ProgramState, clock: ToolClock | None,
                 workers: Mapping[str, WorkerState] | None,
                 requests: Mapping[str, RequestState] | None) -> _Outside:
        """What of a program's view lives outside the program: its context as its ready or
        running request holds it, its tool clock, and (paused) its residency."""
        worker = workers.get(p.worker_id) if workers and p.worker_id else None
        resident: tuple[bool | None, int | None] = (
            self._residency.of(p.id, worker)
            if worker is not None and p.status == ProgramStatus.PAUSED else (None, None))
        return _context(p, requests), clock.key() if clock else None, resident

    def forget_gone(self, programs: Mapping[str, ProgramState]) -> None:
        for pid in [pid for pid in self._cache if pid not in programs]:
            del self._cache[pid]


def _context(p: ProgramState, requests: Mapping[str, RequestState] | None) -> int:
    """The program's context as its KV holds it: the last request's, or the one ready or
    running now (prompt and output so far) when that is larger."""
    rid = p.ready_request or p.active_request
    req = requests.get(rid) if requests and rid else None
    if req is None:
        return p.context_tokens
    return max(p.context_tokens, prompt_estimate(req) + req.output_tokens)


def _program_view(p: ProgramState, clock: ToolClock | None = None,
                  kv_resident: bool | None = None, kv_cached_tokens: int | None = None,
                  context: int | None = None) -> ProgramView:
    acting_since, ended_at = _acting(p, clock)
    measured = clock.mean_s if clock else None
    return ProgramView(
        program_id=p.id, status=_TO_KV[p.status],
        context_tokens=p.context_tokens if context is None else context,
        created_at=p.created_at, worker_id=p.worker_id, acting_since=acting_since,
        ready_since=p.ready_since, pending_request=p.ready_request is not None,
        pinned=p.pinned, pause_marked=p.pause_marked,
        tool_time_mean_s=p.tool_time_mean_s if measured is None else measured,
        kv_resident=kv_resident, kv_cached_tokens=kv_cached_tokens, migrate_to=p.migrate_to,
        kv_node=p.kv_node,
        prefix_group=p.prefix_group, prefix_tokens=p.prefix_tokens,
        tool_running=bool(clock and clock.running),
        tool_last_s=clock.last_s if clock else None, tool_ended_at=ended_at,
    )


def _acting(p: ProgramState, clock: ToolClock | None) -> tuple[float | None, float | None]:
    """(acting_since, tool_ended_at): a tool agentd started since the last request ended
    moves the acting clock to the tool's start (the gap before it was the client's, not
    the tool's); its end, once it ended, says the next request is due."""
    if clock is None or clock.started_at is None or p.acting_since is None:
        return p.acting_since, None
    if clock.started_at < p.acting_since:
        return p.acting_since, None
    return clock.started_at, None if clock.running else clock.ended_at
