"""Request tagging at submit (H-MAS perception), cheap enough for the gateway's hot path.

A request gets a task type from rules over its last user message (cached per program:
an agent program's steps share its task), an importance from its priority, its tenant's
SLO for the task (an override from [slo.tenants], else Table 6), a predicted output
length learned online from finished requests (per task and prompt-length bucket), a
conformal upper bound, and the cost proxies. Nothing waits for a model: this is the rule
path the paper falls back to, so a request never reaches the head of the queue untagged.
Both lengths are capped by the request's max_tokens.

The prompt length is estimated from characters (about 4 per token) or, for a later step
of a program, from its context so far, whichever is larger; the worker reports the real
count, which is what the predictors learn from.

Per request this costs a dict lookup or two: the predictors' medians and conformal
quantiles (sorts over their windows) are recomputed only every `REFRESH` observations of
a cell, SLOs are resolved once per (task, importance), and tags once per distinct text.
"""

from __future__ import annotations

import functools
from collections import Counter
from typing import TYPE_CHECKING, Generic, TypeVar

from daemon.access.names import DEFAULT_TENANT
from daemon.state import prompt_estimate
from scheduling.slo.admission import ConformalCalibrator
from scheduling.slo.metrics import CompletionRecord
from scheduling.slo.prediction import (
    CostModel,
    LengthPredictor,
    Perceiver,
    QueuedRequest,
    RequestSpec,
    TaskTagger,
    prompt_bucket,
)
from scheduling.slo.templates import Slo, SloTable, TaskType

if TYPE_CHECKING:
    from daemon.state import ProgramState, RequestState

TAG_CHARS = 2000  # the rules look at the start of the last user message
REFRESH = 16  # observations of a cell before its median or quantile is recomputed
TAG_CACHE = 4096

Cell = TypeVar("Cell")
Value = TypeVar("Value")


def importance(priority: int) -> float:
    """Priority 0 is the paper's neutral 0.75; each step up or down moves it by 0.125."""
    return min(1.0, max(0.5, 0.75 + 0.125 * priority))


class _Refreshing(Generic[Cell, Value]):
    """Counts observations per cell; a cell's cached value is dropped every REFRESH."""

    def __init__(self) -> None:
        self.cache: dict[Cell, Value] = {}
        self._since: Counter[Cell] = Counter()

    def observed(self, cell: Cell) -> None:
        self._since[cell] += 1
        if self._since[cell] >= REFRESH or self.cache.get(cell) is None:
            self.cache.pop(cell, None)
            self._since[cell] = 0


class CachedLengths(LengthPredictor):
    def __init__(self) -> None:
        super().__init__()
        self._refresh: _Refreshing[tuple[TaskType, int], int] = _Refreshing()
        self.cap = 1 << 30  # the request being tagged can generate no more than this

    def observe(self, task: TaskType, prompt_tokens: int, output_tokens: int) -> None:
        super().observe(task, prompt_tokens, output_tokens)
        self._refresh.observed((task, prompt_bucket(prompt_tokens)))

    def predict(self, task: TaskType, prompt_tokens: int) -> int:
        cell = (task, prompt_bucket(prompt_tokens))
        value = self._refresh.cache.get(cell)
        if value is None:
            value = self._refresh.cache[cell] = super().predict(task, prompt_tokens)
        return min(self.cap, value)


class CachedCalibrator(ConformalCalibrator):
    def __init__(self, max_tokens: int) -> None:
        super().__init__(max_tokens=max_tokens)
        self._refresh: _Refreshing[int, float | None] = _Refreshing()
        self.cap = max_tokens

    def upper(self, prompt_tokens: int, l_pred: int, max_tokens: int | None = None) -> int:
        return super().upper(prompt_tokens, l_pred, self.cap if max_tokens is None else max_tokens)

    def observe(self, prompt_tokens: int, l_pred: int, l_real: int) -> None:
        super().observe(prompt_tokens, l_pred, l_real)
        self._refresh.observed(prompt_bucket(prompt_tokens))

    def quantile(self, prompt_tokens: int) -> float | None:
        bucket = prompt_bucket(prompt_tokens)
        if bucket not in self._refresh.cache:
            self._refresh.cache[bucket] = super().quantile(prompt_tokens)
        return self._refresh.cache[bucket]


class CachedSlos:
    """A SloTable's answers by (task, importance, tenant): the table is immutable."""

    def __init__(self, table: SloTable) -> None:
        self.table = table
        self._cache: dict[tuple[TaskType, float, str | None], Slo] = {}

    def resolve(self, task: TaskType, importance: float, tenant: str | None = None,
                override: Slo | None = None) -> Slo:
        if override is not None:
            return override
        key = (task, importance, tenant)
        slo = self._cache.get(key)
        if slo is None:
            slo = self._cache[key] = self.table.resolve(task, importance, tenant)
        return slo


class Tagging:
    def __init__(self, max_tokens: int, slos: SloTable | None = None) -> None:
        self.lengths = CachedLengths()
        self.costs = CostModel()
        self.bound = CachedCalibrator(max_tokens)
        self.tagger = TaskTagger()
        self.perceiver = Perceiver(self.tagger, self.lengths, self.costs,
                                   CachedSlos(slos or SloTable()), self.bound)  # type: ignore[arg-type]
        self.program_task: dict[str, TaskType] = {}
        # Program -> tenant of its next request, set by whoever submits it
        # (daemon/core/tenants.py); a program nobody set runs as the default tenant.
        self.tenants: dict[str, str] = {}
        self._tag = functools.lru_cache(maxsize=TAG_CACHE)(self.tagger.tag)

    def tag(self, req: RequestState, program: ProgramState) -> QueuedRequest:
        text = _rule_text(req)
        task = self.program_task.get(program.id)
        if task is None:
            task = self.program_task[program.id] = self._tag(text[:TAG_CHARS])
        prompt_tokens = max(program.context_tokens, prompt_estimate(req))
        tenant = self.tenants.get(program.id, DEFAULT_TENANT)
        spec = RequestSpec(req.id, tenant, req.queued_at, "", prompt_tokens,
                           importance(req.priority), req.priority, task)
        # Both lengths are capped by this request's max_tokens, set for this one call.
        self.lengths.cap = self.bound.cap = req.sampling.max_tokens
        return self.perceiver.perceive(spec)

    def forget(self, program_id: str) -> None:
        self.program_task.pop(program_id, None)
        self.tenants.pop(program_id, None)

    def learn(self, req: RequestState, q: QueuedRequest) -> CompletionRecord | None:
        """Feed a finished request to the predictors; its completion record for the views."""
        first, done = req.first_token_at, req.finished_at
        if first is None or done is None:
            return None
        prompt = req.prompt_tokens or q.prompt_tokens
        out = req.output_tokens
        self.lengths.observe(q.task, prompt, out)
        self.bound.observe(prompt, q.l_pred, out)
        tpot = (done - first) / (out - 1) if out > 1 else None
        if req.failovers == 0 and req.dispatched_at is not None:
            self.costs.observe(prompt, first - req.dispatched_at, tpot)
        return CompletionRecord(
            request_id=req.id, tenant=q.tenant, worker=req.worker_id or "",
            arrival_s=req.queued_at, finish_s=done, prompt_tokens=prompt, output_tokens=out,
            ttft_s=first - req.queued_at, tpot_s=tpot or 0.0, slo_ttft_s=q.slo.ttft_s,
            slo_tpot_s=q.slo.tpot_s, task=q.task.value, l_pred=q.l_pred,
        )


def _rule_text(req: RequestState) -> str:
    """The text the tagging rules read: the prompt, or the last user message."""
    if req.messages is None:
        return req.prompt or ""
    return next((m.content for m in reversed(req.messages) if m.role == "user"), "")
