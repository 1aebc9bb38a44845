"""The SLO layer of a replay (H-MAS): perception, per-worker ready queues under an
ordering policy, the meta controller, and the stability agent's admission fence.

Requests the KV layer routed to a worker wait in that worker's queue; the worker's local
controller dispatches in queue order while fewer than N_run requests are in flight and,
with the fence on, while Eq. 2 admits the head. Holding requests back is what lets the
ordering matter: the sim itself is FCFS.

Stacks by name: a pool policy (``fcfs``, ``sjf``, ``edf``, ``two_lane`` ...) fixed;
``meta-rules`` / ``meta-bandit`` / ``meta-llm`` switch among the pool; ``full`` is
meta-rules plus the admission fence, both control loops and online length prediction
with conformal bounds. Ablations of ``full``: ``full-no-two-lane`` (two-lane out of the
pool), ``full-frozen-statera`` (fence on, loops frozen at their maximum),
``full-no-meta`` (SJF fixed), ``full-rule-prediction`` (no online length learning: every
request gets the predictor's default length and the bound stays at the token cap).

``meta-llm`` has no model to ask in virtual time: without a ``respond`` function it
gets no reply, so ``LlmSelector`` falls back to the rule map on every decision.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from daemon.engines.sim import CostModel, SchedulerConfig
from daemon.replay.metrics import RequestRecord
from daemon.replay.worker import SimWorker
from scheduling.admission import (
    AdmissionFence,
    Band,
    ConcurrencyController,
    ConformalCalibrator,
    ExecutionControls,
    StateraAgent,
    TokenBudgetController,
)
from scheduling.meta import (
    ContextualBandit,
    LlmSelector,
    MetaLoop,
    PolicySelector,
    Rollback,
    RuleMap,
    Switch,
)
from scheduling.ordering import RequestQueue, default_registry, switch
from scheduling.prediction import (
    CostModel as CostProxy,
)
from scheduling.prediction import (
    LengthPredictor,
    Perceiver,
    QueuedRequest,
    RequestSpec,
    TaskTagger,
)
from scheduling.slo_templates import SloTable, TaskType
from scheduling.views import ViewBuilder

POOL = default_registry().names()
BANDIT_ARMS = ("fcfs", "sjf", "edf", "two_lane")
META_INITIAL = "sjf"  # H-MAS Algorithm 1 starts from SJF


@dataclass(frozen=True)
class SloStack:
    name: str
    initial: str = "fcfs"
    selector: str | None = None  # "rules" | "bandit" | "llm"
    pool: tuple[str, ...] = POOL
    fence: bool = False
    adaptive: bool = False
    learn_lengths: bool = True
    meta_interval_s: float = 30.0


_FULL = SloStack("full", META_INITIAL, "rules", fence=True, adaptive=True)
STACKS: Mapping[str, SloStack] = {
    "meta-rules": SloStack("meta-rules", META_INITIAL, "rules"),
    "meta-bandit": SloStack("meta-bandit", META_INITIAL, "bandit"),
    "meta-llm": SloStack("meta-llm", META_INITIAL, "llm"),
    "full": _FULL,
    "full-no-two-lane": replace(_FULL, name="full-no-two-lane",
                                pool=tuple(p for p in POOL if p != "two_lane")),
    "full-frozen-statera": replace(_FULL, name="full-frozen-statera", adaptive=False),
    "full-no-meta": replace(_FULL, name="full-no-meta", selector=None),
    "full-rule-prediction": replace(_FULL, name="full-rule-prediction", learn_lengths=False),
}


def slo_stack(name: str) -> SloStack:
    if name in STACKS:
        return STACKS[name]
    if name in POOL:
        return SloStack(name, initial=name)
    raise KeyError(f"unknown ordering {name!r}; known: {sorted([*POOL, *STACKS])}")


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
        self.fence = AdmissionFence()
        for w in workers:
            self.fence.set_capacity(w, sched.kv_capacity_tokens)
        self.agents = {w: self._agent() for w in workers}
        self.controls = {w: ExecutionControls(self.max_tokens, self.max_seqs) for w in workers}
        self.meta = self._meta()
        self.queued: dict[str, QueuedRequest] = {}
        self.inflight: dict[str, dict[str, QueuedRequest]] = {w: {} for w in workers}
        self.switches = self.rollbacks = 0
        self.views = ViewBuilder()

    def _agent(self) -> StateraAgent:
        return StateraAgent(
            Band(0.5, 0.9),
            TokenBudgetController(512, self.max_tokens, eta=float(self.max_tokens)),
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
            selector = LlmSelector(s.pool, RuleMap(s.initial))
        else:
            selector = RuleMap(s.initial)
        return MetaLoop(selector, s.pool, s.initial, s.meta_interval_s)

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
        self.queues[record.worker].push(self.queued.pop(record.request_id), now)

    def pump(self, worker: str, now: float) -> list[str]:
        """Request ids the local controller dispatches to ``worker`` now, in order."""
        queue, controls, out = self.queues[worker], self.controls[worker], []
        while (head := queue.peek(now)) is not None and self._may_admit(worker, head, controls):
            request = queue.pop(now)
            self.inflight[worker][request.request_id] = request
            self.fence.on_admitted(worker, request.request_id, _demand(request))
            out.append(request.request_id)
        return out

    def _may_admit(self, worker: str, head: QueuedRequest, controls: ExecutionControls) -> bool:
        if len(self.inflight[worker]) >= (controls.n_run if self.stack.fence else self.max_seqs):
            return controls.unbounded
        return not self.stack.fence or self.fence.decide(head, worker, controls).admit

    def on_finished(self, record: RequestRecord, now: float) -> None:
        request = self.inflight[record.worker].pop(record.request_id)
        self.fence.on_finished(record.worker, record.request_id)
        if self.stack.learn_lengths:
            self.lengths.observe(request.task, request.prompt_tokens, record.output_tokens)
            self.bound.observe(request.prompt_tokens, request.l_pred, record.output_tokens)
        done = record.completion()
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
                self.controls[w] = self.agents[w].step(util, bypass)
                worker.set_token_budget(self.controls[w].token_budget)
            else:
                self.controls[w] = ExecutionControls(self.max_tokens, self.max_seqs, bypass)

    def _meta_tick(self, now: float) -> None:
        if self.meta is None:
            return
        selector = self.meta.selector
        if self.respond is not None and isinstance(selector, LlmSelector):
            selector.on_response(self.respond(selector.build_prompt(self.views.long_view(now))))
        before = self.meta.active
        events = self.meta.tick(self.views.short_view(now), self.views.long_view(now), now)
        self.switches += sum(isinstance(e, Switch) for e in events)
        self.rollbacks += sum(isinstance(e, Rollback) for e in events)
        if self.meta.active != before:
            for queue in self.queues.values():
                switch(queue, self.registry.create(self.meta.active), now)


def _demand(request: QueuedRequest) -> int:
    return request.prompt_tokens + request.l_upper


def _proxy(cost: CostModel) -> CostProxy:
    """Seed the cost proxies from the sim's step model, as a calibrated daemon would."""
    return CostProxy(prefill_base_s=cost.c0, prefill_per_token_s=cost.c_prefill + cost.c_attn,
                     tpot_s=cost.c0 + cost.c_decode)
