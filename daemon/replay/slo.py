"""The SLO layer of a replay (H-MAS): perception, per-worker ready queues under an
ordering policy, the meta controller and the stability agent (stacks: ``slo_stacks``).

Requests the KV layer routed to a worker wait in that worker's queue, and its local
controller dispatches them in queue order. The sim (like vLLM) serves what it holds FCFS,
so the controller hands it only about ``GATE_STEPS`` steps of unprefilled prompt at a time:
otherwise a few hundred requests would wait in the engine's FIFO and the ordering policy
would decide nothing. On top of that gate: fewer than N_run requests in flight and, with
the fence on, Eq. 2 admits the head.

With the loops on, the token budget B_token is the sim's per-step batched-token limit and
tracks decode pressure (inter-token time over the TPOT SLO), see ``_decode_pressure``.

``meta-llm`` has no model to ask in virtual time: without a ``respond`` function it
gets no reply, so ``LlmSelector`` falls back to the rule map on every decision.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import replace

from daemon.engines.sim import CostModel, SchedulerConfig
from daemon.replay.metrics import RequestRecord
from daemon.replay.slo_stacks import (
    BANDIT_ARMS,
    GATE_STEPS,
    GUARDS,
    LONG_WINDOW_S,
    ORDERINGS,
    RULES,
    SloStack,
    slo_stack,
)
from daemon.replay.worker import SimWorker
from scheduling.slo.admission import (
    AdmissionFence,
    Band,
    ConcurrencyController,
    ConformalCalibrator,
    ExecutionControls,
    StateraAgent,
    TokenBudgetController,
    kv_demand,
)
from scheduling.slo.meta import (
    ContextualBandit,
    LlmSelector,
    MetaLoop,
    PolicySelector,
    Rollback,
    RuleMap,
    Switch,
)
from scheduling.slo.ordering import RequestQueue, default_registry, switch
from scheduling.slo.prediction import CostModel as CostProxy
from scheduling.slo.prediction import (
    LengthPredictor,
    Perceiver,
    QueuedRequest,
    RequestSpec,
    TaskTagger,
)
from scheduling.slo.templates import SloTable, TaskType
from scheduling.slo.views import ViewBuilder, percentile

__all__ = ["GATE_STEPS", "ORDERINGS", "SloLayer", "SloStack", "slo_stack"]


class SloLayer:
    def __init__(
        self, stack: SloStack, workers: list[str], sched: SchedulerConfig, cost: CostModel,
        slos: SloTable | None = None, respond: Callable[[str], str] | None = None,
    ) -> None:
        self.stack, self.respond = stack, respond
        self.registry = default_registry()
        self.queues = {w: RequestQueue(self.registry.create(stack.initial)) for w in workers}
        self.max_seqs, self.max_tokens = sched.max_num_seqs, sched.max_num_batched_tokens
        self.bound = ConformalCalibrator(max_tokens=4096)
        self.lengths = LengthPredictor()
        self.perceiver = Perceiver(TaskTagger(), self.lengths, _proxy(cost), slos or SloTable(),
                                   self.bound)
        # A paged cache wastes at most one part-filled block per sequence: that, not the
        # default 10%, is the fragmentation margin of the sim (and of vLLM).
        self.fence = AdmissionFence(
            delta_frag=self.max_seqs * (sched.block_size - 1) / sched.kv_capacity_tokens)
        for w in workers:
            self.fence.set_capacity(w, sched.kv_capacity_tokens)
        self.agents = {w: self._agent() for w in workers}
        self.controls = {w: ExecutionControls(self.max_tokens, self.max_seqs) for w in workers}
        self.meta = self._meta()
        self.queued: dict[str, QueuedRequest] = {}
        self.records: dict[str, RequestRecord] = {}
        self.prefilling: dict[str, dict[str, RequestRecord]] = {w: {} for w in workers}
        # Dispatched requests, with the harness's record of their timings.
        self.inflight: dict[str, dict[str, tuple[QueuedRequest, RequestRecord]]] = {
            w: {} for w in workers}
        self.switches = self.rollbacks = 0
        self.views = ViewBuilder(long_window_s=LONG_WINDOW_S)
        self._steps: dict[str, int] = {}
        self.tpot_ratios: dict[str, deque[tuple[float, float]]] = {w: deque() for w in workers}
        self._last_tick = 0.0

    def _agent(self) -> StateraAgent:
        return StateraAgent(
            Band(0.5, 0.9),
            TokenBudgetController(512, self.max_tokens, eta=self.max_tokens / 2),
            ConcurrencyController(4, self.max_seqs, eta=self.max_seqs / 4),
        )

    def _meta(self) -> MetaLoop | None:
        s = self.stack
        selector: PolicySelector
        if s.selector is None:
            return None
        if s.selector == "bandit":
            selector = ContextualBandit([a for a in BANDIT_ARMS if a in s.pool])
        elif s.selector == "llm":
            selector = LlmSelector(s.pool, RuleMap(s.initial, RULES, s.lanes))
        else:
            selector = RuleMap(s.initial, RULES, s.lanes)
        return MetaLoop(selector, s.pool, s.initial, s.meta_interval_s, GUARDS)

    # --- per request ------------------------------------------------------------------

    def perceive(self, record: RequestRecord) -> None:
        task = TaskType(record.task)
        spec = RequestSpec(record.request_id, record.tenant, record.arrival, "",
                           record.prompt_tokens, task=task)
        q = self.perceiver.perceive(spec)
        self.queued[record.request_id] = q
        record.slo_ttft_s, record.slo_tpot_s, record.l_pred = q.slo.ttft_s, q.slo.tpot_s, q.l_pred
        self.views.on_arrival(record.arrival)

    def enqueue(self, record: RequestRecord, now: float) -> None:
        self.records[record.request_id] = record
        self.queues[record.worker].push(self.queued.pop(record.request_id), now)

    def pump(self, worker: str, now: float) -> list[str]:
        """Request ids the local controller dispatches to ``worker`` now, in order."""
        queue, controls, out = self.queues[worker], self.controls[worker], []
        backlog = self._prefill_backlog(worker)
        while (head := queue.peek(now)) is not None and self._may_admit(
                worker, self._rebound(head), controls, backlog):
            queue.pop(now)
            request, rid = self._rebound(head), head.request_id
            record = self.records.pop(rid)
            self.inflight[worker][rid] = request, record
            self.prefilling[worker][rid] = record
            backlog += request.prompt_tokens
            self.fence.on_admitted(worker, rid, kv_demand(request))
            out.append(rid)
        return out

    def _rebound(self, request: QueuedRequest) -> QueuedRequest:
        """The request with its length bound from the calibration as it stands now: one
        perceived before its bucket had errors carries the token cap, and would hold that
        much KV against the fence for nothing."""
        upper = self.bound.upper(request.prompt_tokens, request.l_pred)
        return request if upper == request.l_upper else replace(request, l_upper=upper)

    def _prefill_backlog(self, worker: str) -> int:
        """Prompt tokens dispatched to ``worker`` whose first token has not come back yet."""
        waiting = self.prefilling[worker]
        for rid in [r for r, rec in waiting.items() if rec.first_token is not None]:
            del waiting[rid]
        return sum(rec.prompt_tokens for rec in waiting.values())

    def _may_admit(self, worker: str, head: QueuedRequest, controls: ExecutionControls,
                   backlog: int) -> bool:
        if controls.unbounded:
            return True
        # Order is decided here, not in the engine's FCFS queue: hand the engine only about
        # GATE_STEPS steps of prefill ahead (always at least one request).
        if backlog > 0 and backlog + head.prompt_tokens > GATE_STEPS * controls.token_budget:
            return False
        if len(self.inflight[worker]) >= (controls.n_run if self.stack.fence else self.max_seqs):
            return False
        return not self.stack.fence or self.fence.decide(head, worker, controls).admit

    def on_finished(self, record: RequestRecord, now: float) -> None:
        request, _ = self.inflight[record.worker].pop(record.request_id)
        self.fence.on_finished(record.worker, record.request_id)
        if self.stack.learn_lengths:
            self.lengths.observe(request.task, request.prompt_tokens, record.output_tokens)
            self.bound.observe(request.prompt_tokens, request.l_pred, record.output_tokens)
        done = record.completion()
        if done.ttft_ok:
            self.tpot_ratios[record.worker].append((now, done.tpot_s / done.slo_tpot_s))
        if record.first_token is not None:
            self.perceiver.costs.observe(record.prompt_tokens, record.first_token - record.dispatch,
                                         done.tpot_s if record.output_tokens > 1 else None)
        self.views.on_completion(done)

    # --- per cycle --------------------------------------------------------------------

    def tick(self, now: float, workers: Mapping[str, SimWorker]) -> None:
        for w, worker in workers.items():
            self.views.on_sample(now, w, len(self.queues[w]), worker.used_fraction)
        self._meta_tick(now)
        bypass = self.meta.bypass_active if self.meta else False
        for w, worker in workers.items():
            if self.stack.adaptive:
                util = self.views.short_view(now, w).kv_util
                pressure = self._decode_pressure(w, worker, now)
                self.controls[w] = self.agents[w].step(util, bypass, pressure)
                worker.set_token_budget(self.controls[w].token_budget)
            else:
                self.controls[w] = ExecutionControls(self.max_tokens, self.max_seqs, bypass)
        self._last_tick = now

    def _decode_pressure(self, w: str, worker: SimWorker, now: float) -> float:
        """Inter-token time over the TPOT SLO of the requests running on ``w`` that can
        still meet their SLO (one past its TTFT SLO has nothing left to lose, and a backlog
        of those should be drained at full speed).

        Every running request gets one token per step, so the cycle's length over the steps
        the worker reports (its cumulative counter, as the daemon sees it) is their
        inter-token time, measured at once. That holds only while the worker never idled,
        which is certain while the local controller holds requests back; otherwise the
        p90 TPOT/SLO of the requests that finished in the last short window stands in
        (it lags by a request's length, but idling cannot inflate it)."""
        steps = worker.scheduler.stats().steps
        done, self._steps[w] = steps - self._steps.get(w, 0), steps
        recent = self.tpot_ratios[w]
        while recent and recent[0][0] < now - self.views.short_window_s:
            recent.popleft()
        savable = [q.slo.tpot_s for q, rec in self.inflight[w].values() if _savable(q, rec, now)]
        if done > 0 and savable and len(self.queues[w]) > 0:
            # Against the SLO that 80% of them meet: a few tight ones in a lax mix should
            # not halve everyone's prefill rate.
            return (now - self._last_tick) / done / percentile(savable, 20)
        return percentile([ratio for _, ratio in recent], 90) if savable else 0.0

    def _meta_tick(self, now: float) -> None:
        if self.meta is None:
            return
        selector = self.meta.selector
        if self.respond is not None and isinstance(selector, LlmSelector):
            selector.on_response(self.respond(selector.build_prompt(self.views.long_view(now))))
        before = self.meta.active
        events = self.meta.tick(self.views.short_view(now),
                                lambda: self.views.long_view(now), now)
        self.switches += sum(isinstance(e, Switch) for e in events)
        self.rollbacks += sum(isinstance(e, Rollback) for e in events)
        if self.meta.active != before:
            for queue in self.queues.values():
                switch(queue, self.registry.create(self.meta.active), now)


def _savable(request: QueuedRequest, record: RequestRecord, now: float) -> bool:
    deadline = request.arrival_s + request.slo.ttft_s
    return (now if record.first_token is None else record.first_token) <= deadline


def _proxy(cost: CostModel) -> CostProxy:
    """Seed the cost proxies from the sim's step model, as a calibrated daemon would."""
    return CostProxy(prefill_base_s=cost.c0, prefill_per_token_s=cost.c_prefill + cost.c_attn,
                     tpot_s=cost.c0 + cost.c_decode)
