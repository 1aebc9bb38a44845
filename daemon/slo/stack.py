"""The SLO scheduling stack in the daemon (H-MAS): the ordered global queue, the stability
agent's admission, and the meta controller's loop, each a swappable policy layer.

- Fast path (per request, from Core): `on_submit` tags and queues a request, `admit`
  asks the admission policy whether the queue's head may start on a worker, `on_dispatch`
  and `on_release` keep the fence's ledger of reserved KV, `on_end` learns from it.
- Every `cycle_s` (`tick`): sample the workers into the QoS views, run the meta loop
  (rollback guard and bypass every cycle, the meta policy's choice every
  `meta_interval_s`, on a long view built in steps between dispatches:
  daemon/slo/long_view.py),
  switch the ordering policy if the loop says so (the queue is rebuilt in place between
  two dispatches), and step the admission policy's controls.

What the engines cannot take is not pretended: vLLM has no per-cycle token budget
(`max_num_batched_tokens` is fixed when it starts) and the worker protocol carries none,
so the budget the admission policy computes is reported, not applied; what is enforced
is the KV fence and N_run, through what the daemon dispatches.

Every switch, rollback, bypass and admission refusal is a trace event with its reason and
the versions of the policies that made it; so is every decision of the LLM meta selector
(daemon/slo/llm.py asks the model, off the loop).

Requests are tagged with their tenant (daemon/core/tenants.py); the tenants' WFQ/stride
weights and SLO overrides come from [slo.tenants] and apply to the built-in policies.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from daemon.access.names import INTERNAL_TENANT
from daemon.access.session_tenants import SessionTenants
from daemon.policies.slo_layers import ORDERING_BUILTINS, AdmissionSnapshot, startup_policy
from daemon.policies.swap import Active, Failure, Guard
from daemon.slo.llm import LlmCaller
from daemon.slo.long_view import SteppedLongView
from daemon.slo.queue import OrderedQueue, WaitingQueue, weigh_tenants
from daemon.slo.settings import SloSettings
from daemon.slo.tagging import Tagging
from daemon.state import Host, RequestState, RequestStatus, WorkerState
from scheduling.layers import (
    ADMISSION_POLICIES,
    META_POLICIES,
    NOMINAL_TOKEN_BUDGET,
    RulesMeta,
)
from scheduling.slo import metrics as slo_metrics
from scheduling.slo.admission import (
    AdmissionDecision,
    AdmissionFence,
    ExecutionControls,
    kv_demand,
)
from scheduling.slo.meta import BypassOn, Decision, MetaEvent, MetaLoop, Rollback, Switch
from scheduling.slo.meta_llm import LlmMeta
from scheduling.slo.metrics import CompletionRecord
from scheduling.slo.prediction import QueuedRequest
from scheduling.slo.templates import SloTable
from scheduling.slo.views import LongView, ViewBuilder

log = logging.getLogger("agentd.slo")


@dataclass
class SloStats:
    """Cumulative counters for /metrics."""

    completed: int = 0
    met: int = 0
    ttft_ok: int = 0
    tpot_ok: int = 0
    esg: float = 0.0
    esg_max: float = 0.0
    switches: int = 0
    rollbacks: int = 0
    bypasses: int = 0
    refusals: int = 0

    def observe(self, r: CompletionRecord) -> None:
        self.completed += 1
        self.met += r.ok
        self.ttft_ok += r.ttft_ok
        self.tpot_ok += r.tpot_ok
        base = slo_metrics.base_value(r)
        self.esg += base * slo_metrics.service_gain(r)
        self.esg_max += base


class _Selector:
    """The meta layer's guard, as the PolicySelector MetaLoop calls."""

    def __init__(self, guard: Guard) -> None:
        self.guard = guard

    def choose(self, view: LongView, now: float) -> Decision:
        decision = self.guard.call(lambda p: p.choose(view, now))
        if isinstance(decision, Decision) and isinstance(decision.policy_name, str):
            return decision
        self.guard.reject(f"choose returned {decision!r}, not a Decision")
        return Decision("", "the meta policy returned no decision")

    def on_applied(self, policy_name: str) -> None:
        self.guard.call(lambda p: p.on_applied(policy_name))


class SloControl:
    def __init__(self, core: Host, settings: SloSettings, llm: LlmCaller) -> None:
        """`llm`: the meta-llm policy's caller, which submits to the core as a client."""
        self.core = core
        self.settings = settings
        config = core.config
        self.tagging = Tagging(config.max_tokens_limit,
                               SloTable(tenant_overrides=settings.tenant_slos))
        self.tenants = SessionTenants(core.sessions, core.writer)
        self.llm = llm
        self.views = ViewBuilder(settings.short_window_s, settings.long_window_s)
        self.long = SteppedLongView(self.views, config.meta_interval_s, self._view_built)
        self.fence = AdmissionFence(settings.delta_frag)
        self.tags: dict[str, QueuedRequest] = {}  # request id -> tag, until the request ends
        self.running: dict[str, tuple[str, int]] = {}  # request id -> (worker, reserved KV)
        self.controls: dict[str, ExecutionControls] = {}
        self.refused: set[str] = set()
        self.stats = SloStats()
        self.pool: set[str] = set(ORDERING_BUILTINS)
        self._known: dict[str, Active] = {}
        self._switching = False
        name = startup_policy(config, "ordering")
        self._ordering = Active(name, 1, ORDERING_BUILTINS[name]())
        weigh = weigh_tenants(settings.tenant_weights)
        weigh(self._ordering)
        self.ordered = OrderedQueue(self._ordering, clock=core.clock, tune=weigh)
        self.ordered.on_switched = self._ordering_changed
        self.waiting = WaitingQueue(self.ordered)
        name = startup_policy(config, "admission")
        self.admission = Guard(Active(name, 1, ADMISSION_POLICIES[name]()), layer="admission")
        name = startup_policy(config, "meta")
        meta = Active(name, 1, META_POLICIES[name](**self.meta_tuning(name)))
        self.meta = Guard(meta, layer="meta", on_change=self._meta_changed)
        self.loop = self._make_loop(self._ordering.name)

    # --- hosting the layers (daemon/policies/slo_layers.py) -------------------------------

    def guards(self) -> dict[str, Guard]:
        return {"ordering": self.ordered.guard, "meta": self.meta, "admission": self.admission}

    def install(self, layer: str, active: Active, on_failure: Callable[[Failure], None]) -> Guard:
        guard = self.guards()[layer]

        def failed(failure: Failure) -> None:
            self._on_failure(failure)
            on_failure(failure)

        guard.on_failure = failed
        if active.name == guard.current.name:
            guard.reset(active)
        else:  # a stored operator version: the config's built-in stays as its fallback
            guard.swap(active)
        return guard

    def meta_tuning(self, name: str) -> dict[str, Any]:
        if name not in (RulesMeta.name, LlmMeta.name):
            return {}
        return {"thresholds": self.settings.rules, "initial": self.ordered.policy_name}

    def admission_snapshot(self) -> AdmissionSnapshot:
        fence = AdmissionFence(self.fence.delta_frag)
        workers = []
        for w in self.core.workers.values():
            fence.set_capacity(w.id, w.kv_capacity_tokens)
            workers.append((w.id, _kv_util(w), w.max_batch))
        for rid, (worker, demand) in self.running.items():
            fence.on_admitted(worker, rid, demand)
        return AdmissionSnapshot(fence, tuple(workers), tuple(self.ordered.snapshot(8)))

    def _on_failure(self, failure: Failure) -> None:
        self.stats.rollbacks += failure.layer == "ordering"
        if failure.layer == "ordering" and failure.failed.name not in ORDERING_BUILTINS:
            self.pool.discard(failure.failed.name)
            self._known.pop(failure.failed.name, None)

    def _ordering_changed(self, active: Active) -> None:
        if active is self._ordering:
            return
        self._ordering = active
        self._known[active.name] = active
        self.pool.add(active.name)
        if not self._switching:  # an operator or a rollback changed it: the loop follows
            self._retarget(active.name)

    def _meta_changed(self, active: Active) -> None:
        name = self.ordered.policy_name
        self.meta.call(lambda p: p.on_applied(name))

    def _make_loop(self, initial: str) -> MetaLoop:
        loop = MetaLoop(_Selector(self.meta), self.pool, initial,
                        self.core.config.meta_interval_s, self.settings.guard)
        self.meta.call(lambda p: p.on_applied(initial))
        return loop

    def _retarget(self, policy_name: str) -> None:
        """A fresh loop from `policy_name` (MetaLoop has no setter for its policy)."""
        bypass = self.loop.bypass  # an overload does not end because a policy changed
        self.loop = self._make_loop(policy_name)
        self.loop.bypass = bypass

    # --- per request ------------------------------------------------------------------------

    def on_submit(self, req: RequestState, now: float) -> QueuedRequest:
        q = self.tagging.tag(req, self.core.programs[req.program_id])
        self.tags[req.id] = q
        self.views.on_arrival(now)
        self.ordered.push(q, now)
        return q

    def has_room(self, worker_id: str) -> bool:
        c = self.controls.get(worker_id)
        return c is None or c.unbounded or self.fence.running(worker_id) < c.n_run

    def open_workers(self) -> set[str]:
        return {w.id for w in self.core.workers.values() if w.healthy and self.has_room(w.id)}

    def admit(self, request_id: str, worker: WorkerState) -> AdmissionDecision:
        q = self.tags.get(request_id)
        if q is None or self.fence.running(worker.id) == 0:
            # An idle worker always takes the head, so no fence can stall the daemon.
            return AdmissionDecision(request_id, worker.id, True, "idle worker", 0, 0, 0.0)
        controls = self.controls.get(worker.id) or ExecutionControls(
            NOMINAL_TOKEN_BUDGET, worker.max_batch)
        d = self.admission.call(lambda p: p.admit(q, worker.id, self.fence, controls))
        if isinstance(d, AdmissionDecision):
            return d
        self.admission.reject(f"admit returned {d!r}, not an AdmissionDecision")
        return AdmissionDecision(request_id, worker.id, True, "admission policy failed", 0, 0, 0)

    def refuse(self, req: RequestState, d: AdmissionDecision) -> None:
        """Record a refusal once per request: later ones repeat it until room frees."""
        if req.id in self.refused:
            return
        self.refused.add(req.id)
        self.stats.refusals += 1
        a = self.admission.current
        self.core.writer.trace(
            "admission.refused", session_id=req.session_id, program_id=req.program_id,
            request_id=req.id, worker_id=d.worker, reason=d.reason, demand_tokens=d.demand_tokens,
            reserved_tokens=d.reserved_tokens, budget_tokens=round(d.budget_tokens),
            running=self.fence.running(d.worker), policy=a.name, policy_version=a.version)

    def on_dispatch(self, req: RequestState, worker_id: str) -> dict[str, Any]:
        """Reserve the request's KV; returns the ordering version for its trace event."""
        q = self.tags.get(req.id)
        demand = kv_demand(q) if q is not None else req.prompt_tokens
        self.fence.on_admitted(worker_id, req.id, demand)
        self.running[req.id] = (worker_id, demand)
        self.refused.discard(req.id)
        o = self.ordered.guard.current
        tenant = {"tenant": q.tenant} if q is not None else {}
        return {"ordering": o.name, "ordering_version": o.version, **tenant}

    def on_release(self, req: RequestState) -> None:
        """The request left its worker (ended, failed over, paused)."""
        held = self.running.pop(req.id, None)
        if held is not None:
            self.fence.on_finished(held[0], req.id)

    def on_end(self, req: RequestState) -> None:
        self.on_release(req)
        self.ordered.discard(req.id)
        self.refused.discard(req.id)
        q = self.tags.pop(req.id, None)
        # The daemon's own calls teach nothing: their short capped replies would drag the
        # length predictions of tenants' requests down, and they serve no tenant.
        if q is None or req.status != RequestStatus.FINISHED or q.tenant == INTERNAL_TENANT:
            return
        record = self.tagging.learn(req, q)
        if record is not None:
            self.views.on_completion(record)
            self.stats.observe(record)

    def describe(self, q: QueuedRequest) -> dict[str, Any]:
        return {"tenant": q.tenant, "task": q.task.value, "l_pred": q.l_pred,
                "slo_ttft_s": q.slo.ttft_s, "slo_tpot_s": q.slo.tpot_s}

    # --- per cycle --------------------------------------------------------------------------

    async def run(self) -> None:
        try:
            while True:
                await asyncio.sleep(self.settings.cycle_s)
                try:
                    self.tick(self.core.clock())
                except Exception:  # the loop must outlive a bad cycle; the next one retries
                    log.exception("SLO scheduling cycle failed")
        finally:
            self.long.stop()
            self.llm.stop()

    def tick(self, now: float) -> None:
        self._sample(now)
        self._meta_step(now)
        self._control(now)
        self.core.pump()

    @property
    def bypass(self) -> bool:
        return _guarded(self.meta.current) and self.loop.bypass_active

    def _sample(self, now: float) -> None:
        healthy = [w for w in self.core.workers.values() if w.healthy]
        if not healthy:
            return
        counts = self._queued_per_worker(healthy)
        for w in healthy:
            self.views.on_sample(now, w.id, counts.get(w.id, 0), _kv_util(w))

    def _queued_per_worker(self, healthy: list[WorkerState]) -> Counter[str]:
        """Queued requests by the worker their program lives on; the rest count on the
        least utilised worker, where they would most likely go."""
        ids = {w.id for w in healthy}
        spare = min(healthy, key=_kv_util).id
        counts: Counter[str] = Counter()
        for rid in self.waiting:
            req = self.core.requests.get(rid)
            program = self.core.programs.get(req.program_id) if req is not None else None
            home = program.worker_id if program is not None else None
            counts[home if home in ids else spare] += 1
        return counts

    def _meta_step(self, now: float) -> None:
        if _guarded(self.meta.current):
            self._meta_tick(now)
        # else meta-off: the operator's ordering stays, unguarded
        if (self._choosing(now) and self.long.fresh(now) is None) or self.long.outdated(now):
            self.long.request(now)

    def _choosing(self, now: float) -> bool:
        """Whether the meta policy's choice is due (and waits for a long view)."""
        loop = self.loop
        return _guarded(self.meta.current) and loop.choice_due(now) and not loop.bypass_active

    def _view_built(self) -> None:
        """A long view landed: make the choice it was built for now, not a cycle later."""
        now = self.core.clock()
        if self._choosing(now):  # not the controls: Statera steps once per cycle
            self._meta_tick(now)
            self.core.pump()

    def _meta_tick(self, now: float) -> None:
        due = self.loop.choice_due(now)
        view = self.long.fresh(now) if due else None
        events = self.loop.tick(self.views.short_view(now), view, now)
        if due and not self.loop.choice_due(now):  # chosen, or a guard restarted the clock
            self.long.used()
        target = self.loop.active
        swap_s = self._switch_to(target) if target != self.ordered.policy_name else 0.0
        for event in events:
            self._record(event, swap_s)
        self.llm.after_tick(self.meta.current.policy)

    def _switch_to(self, name: str) -> float:
        active = self._resolve(name)
        if active is None:
            log.warning("meta loop chose %r, which is not in the ordering pool", name)
            return 0.0
        self._switching = True
        try:
            swap_s = self.ordered.switch(active)
        finally:
            self._switching = False
        if self.ordered.policy_name != name:  # it failed at once and was rolled back
            self._retarget(self.ordered.policy_name)
        return swap_s

    def _resolve(self, name: str) -> Active | None:
        known = self._known.get(name)
        if name in ORDERING_BUILTINS and (known is None or known.version == 1):
            return Active(name, 1, ORDERING_BUILTINS[name]())
        if known is None:
            return None
        return Active(name, known.version, type(known.policy)())

    def _record(self, event: MetaEvent, swap_s: float) -> None:
        o, m = self.ordered.guard.current, self.meta.current
        common = {"version": o.version, "meta": m.name, "meta_version": m.version,
                  "queued": len(self.waiting), "swap_us": round(swap_s * 1e6, 1)}
        if isinstance(event, Switch):
            self.stats.switches += 1
            fields: dict[str, Any] = {"kind": "ordering.switch", "previous": event.previous}
        elif isinstance(event, Rollback):
            self.stats.rollbacks += 1
            fields = {"kind": "ordering.rollback", "rolled_back": event.rolled_back}
        else:
            self.stats.bypasses += isinstance(event, BypassOn)
            fields = {"kind": "meta.bypass", "active": isinstance(event, BypassOn)}
        kind = str(fields.pop("kind"))
        log.info("%s -> %s: %s", kind, event.policy_name, event.reason)
        self.core.writer.trace(kind, policy=event.policy_name, reason=event.reason,
                               **fields, **common)

    def _control(self, now: float) -> None:
        bypass = self.bypass
        for w in self.core.workers.values():
            if not w.healthy:
                self.controls.pop(w.id, None)
                continue
            self.fence.set_capacity(w.id, w.kv_capacity_tokens)
            util = self.views.kv_util(now, w.id)
            self.controls[w.id] = self._controls(w, util, bypass)

    def _controls(self, w: WorkerState, util: float, bypass: bool) -> ExecutionControls:
        c = self.admission.call(lambda p: p.controls(w.id, util, w.max_batch, bypass))
        if isinstance(c, ExecutionControls):
            return c
        self.admission.reject(f"controls returned {c!r}, not ExecutionControls")
        return ExecutionControls(NOMINAL_TOKEN_BUDGET, w.max_batch, unbounded=bypass)

    # --- reading ------------------------------------------------------------------------------

    def window(self, now: float) -> LongView:
        """The newest long view (built in steps at most about one meta interval ago);
        an empty one until the first lands."""
        built = self.long.latest
        if built is not None:
            return built.view
        return ViewBuilder(self.views.short_window_s, self.views.long_window_s).long_view(now)

    def status(self, now: float) -> dict[str, Any]:
        long = self.window(now)
        return {
            "policies": {layer: {"name": g.current.name, "version": g.current.version}
                         for layer, g in self.guards().items()},
            "bypass": self.bypass,
            "queued": len(self.ordered), "parked": len(self.waiting.parked),
            "pool": sorted(self.pool),
            "workers": {w: {"n_run": c.n_run, "token_budget": c.token_budget,
                            "unbounded": c.unbounded, "running": self.fence.running(w),
                            "reserved_tokens": self.fence.reserved(w)}
                        for w, c in self.controls.items()},
            "window": {"seconds": long.window_s, "completions": long.completions,
                       "goodput_rps": long.goodput, "slo_attainment": 1 - long.violation_rate,
                       "ttft_compliance": 1 - long.ttft_violation_rate,
                       "tpot_compliance": 1 - long.tpot_violation_rate,
                       "esg_ratio": long.esg_ratio, "output_len_cv": long.output_len_cv,
                       "view": self.long.status(now)},
            "counters": vars(self.stats),
            "tenants": {"weights": dict(self.settings.tenant_weights),
                        "slo_overrides": sorted(self.settings.tenant_slos),
                        "attainment": dict(long.tenant_attainment)},
            "llm": self.llm.status(),
        }


def _guarded(meta: Active) -> bool:
    return bool(getattr(meta.policy, "guards", True))


def _kv_util(w: WorkerState) -> float:
    s = w.stats
    if s is None or not s.kv_capacity_tokens:
        return 0.0
    return s.kv_used_tokens / s.kv_capacity_tokens
