"""Perception and prediction (H-MAS Sec. 3.2): tag a request, predict its output length and
cost proxies, and attach its SLO and deadline.

The paper tags with a fine-tuned small LLM; this module is the deterministic rule path the
paper's benchmark labeller uses for explicit patterns (Appendix E.5) and answers
``unknown`` whenever the rules do not clearly single out one task, which is the paper's
degraded mode (Sec. 3.2: unknown requests get a coarse prior, not a guess).
"""

from __future__ import annotations

import re
import statistics
from collections import deque
from dataclasses import dataclass, field
from typing import Protocol

from scheduling.slo.templates import Slo, SloTable, TaskType

PROMPT_BUCKET_EDGES: tuple[int, ...] = (128, 512, 2048, 8192, 32768)


def prompt_bucket(prompt_tokens: int) -> int:
    """Index of the prompt-length bucket; shared by length prediction and conformal bounds."""
    for i, edge in enumerate(PROMPT_BUCKET_EDGES):
        if prompt_tokens < edge:
            return i
    return len(PROMPT_BUCKET_EDGES)


@dataclass(frozen=True, slots=True)
class QueuedRequest:
    """A tagged request waiting for (or re-queued after) dispatch.

    ``ttft_pred_s``/``tpot_pred_s`` are the cost proxies t_ttft and t_tpot; ``generated_tokens``
    is the attained service of a request that was preempted and re-queued.
    """

    request_id: str
    tenant: str
    arrival_s: float
    prompt_tokens: int
    task: TaskType
    importance: float
    slo: Slo
    l_pred: int
    l_upper: int
    ttft_pred_s: float
    tpot_pred_s: float
    priority: int = 0
    generated_tokens: int = 0

    @property
    def t_tot(self) -> float:
        """Service-time proxy T_tot = t_ttft + t_tpot * l_pred."""
        return self.ttft_pred_s + self.tpot_pred_s * self.l_pred

    @property
    def deadline(self) -> float:
        """D = a + SLO_ttft + SLO_tpot * l_pred (Sec. 3.5)."""
        return self.arrival_s + self.slo.ttft_s + self.slo.tpot_s * self.l_pred

    @property
    def remaining_s(self) -> float:
        """Predicted service still owed; prefill is already paid once tokens were generated."""
        left = max(0, self.l_pred - self.generated_tokens)
        prefill = self.ttft_pred_s if self.generated_tokens == 0 else 0.0
        return prefill + self.tpot_pred_s * left

    def slack(self, v_sys: float) -> float:
        """Eq. 5: S = D - V_sys - T_tot; lower is more urgent."""
        return self.deadline - v_sys - self.t_tot


_FLAGS = re.IGNORECASE | re.MULTILINE
_T = TaskType
_LANGS = "english|french|spanish|german|chinese|japanese|korean|italian|portuguese|russian"
_RULES: tuple[tuple[TaskType, float, str], ...] = (
    (_T.CODE_GENERATION, 3.0, r"```"),
    (_T.CODE_GENERATION, 2.0, r"\b(function|class|script|program|regex|sql query|unit tests?)\b"),
    (_T.CODE_GENERATION, 1.0, r"\b(python|javascript|typescript|rust|golang|java|c\+\+|bash)\b"),
    (_T.CODE_GENERATION, 1.0, r"\b(implement|refactor|debug|compile|stack ?trace)\b"),
    (_T.TRANSLATION, 3.0, r"\btranslat(e|ion)\b"),
    (_T.TRANSLATION, 2.0, rf"\b(in|into|to) ({_LANGS})\b"),
    (_T.SUMMARIZATION, 3.0, r"\b(summari[sz]e|summary|tl;?dr)\b"),
    (_T.SUMMARIZATION, 1.0, r"\b(key points|main points|in brief|condense)\b"),
    (_T.EXTRACTION, 3.0, r"\bextract\b"),
    (_T.EXTRACTION, 2.0, r"\b(list|find) all (the )?(names|dates|entities|emails|numbers)\b"),
    (_T.EXTRACTION, 1.0, r"\b(as|in|into) json\b"),
    (_T.PARAPHRASING, 3.0, r"\b(paraphrase|rephrase|reword)\b"),
    (_T.PARAPHRASING, 1.0, r"\b(in other words|rewrite (this|the following))\b"),
    (_T.MATH_REASONING, 3.0, r"\b(solve|prove|integral|derivative|equation|theorem)\b"),
    (_T.MATH_REASONING, 2.0, r"\d+\s*[-+*/^=]\s*\d+"),
    (_T.MATH_REASONING, 1.0, r"\b(calculate|compute|how many|probability)\b"),
    (_T.LETTER_DRAFTING, 3.0, r"\b(cover letter|letter to|email to|draft an? (letter|email))\b"),
    (_T.ESSAY_GENERATION, 3.0, r"\bessay\b"),
    (_T.LONG_FORM_GENERATION, 3.0, r"\b(story|novel|chapter|screenplay)\b"),
    (_T.LONG_FORM_GENERATION, 1.0, r"\b(blog post|article)\b"),
    (_T.LONG_FORM_GENERATION, 2.0, r"\b(at least \d{3,} words|in great detail|comprehensive)\b"),
    (_T.RESEARCH, 3.0, r"\b(literature review|research (report|proposal)|survey of)\b"),
    (_T.RESEARCH, 1.0, r"\b(cite|citations|sources|references)\b"),
    (_T.DIALOGUE, 3.0, r"^\s*(hi|hello|hey|good (morning|evening))\b"),
    (_T.DIALOGUE, 2.0, r"\b(how are you|let'?s chat|role-?play|pretend you are)\b"),
    (_T.QA, 2.0, r"^\s*(what|who|when|where|which|why|how|is|are|does|can)\b[^\n]{0,200}\?\s*$"),
    (_T.INSTRUCTION_FOLLOWING, 1.5, r"\b(step[- ]by[- ]step|follow these|bullet points)\b"),
)


@dataclass(frozen=True, slots=True)
class TaskTagger:
    """Scores each task by its matching rules; the winner must lead the runner-up by
    ``margin`` and reach ``min_score``, otherwise the tag is ``unknown``."""

    min_score: float = 2.0
    margin: float = 1.0
    rules: tuple[tuple[TaskType, float, re.Pattern[str]], ...] = field(
        default_factory=lambda: tuple((t, w, re.compile(p, _FLAGS)) for t, w, p in _RULES)
    )

    def tag(self, prompt: str) -> TaskType:
        scores = self.scores(prompt)
        ranked = sorted(scores.items(), key=lambda kv: kv[1], reverse=True)
        if not ranked or ranked[0][1] < self.min_score:
            return TaskType.UNKNOWN
        runner_up = ranked[1][1] if len(ranked) > 1 else 0.0
        return ranked[0][0] if ranked[0][1] - runner_up >= self.margin else TaskType.UNKNOWN

    def scores(self, prompt: str) -> dict[TaskType, float]:
        scores: dict[TaskType, float] = {}
        for task, weight, pattern in self.rules:
            if pattern.search(prompt):
                scores[task] = scores.get(task, 0.0) + weight
        return scores


class LengthPredictor:
    """Online output-length predictor per (task x prompt-length bucket).

    Predicts the median of the last ``window`` finished lengths of the request's cell; a cell
    with fewer than ``min_samples`` falls back to the task's pooled history, then to
    ``default_tokens`` (deliberately generous: under-prediction is what breaks deadlines
    and the memory fence).
    """

    def __init__(self, window: int = 256, min_samples: int = 8, default_tokens: int = 512) -> None:
        self._window = window
        self._min = min_samples
        self._default = default_tokens
        self._cells: dict[tuple[TaskType, int], deque[int]] = {}
        self._tasks: dict[TaskType, deque[int]] = {}

    def observe(self, task: TaskType, prompt_tokens: int, output_tokens: int) -> None:
        """Event hook: a request finished with ``output_tokens`` generated."""
        key = (task, prompt_bucket(prompt_tokens))
        self._cells.setdefault(key, deque(maxlen=self._window)).append(output_tokens)
        self._tasks.setdefault(task, deque(maxlen=self._window)).append(output_tokens)

    def predict(self, task: TaskType, prompt_tokens: int) -> int:
        cell = self._cells.get((task, prompt_bucket(prompt_tokens)))
        for history in (cell, self._tasks.get(task)):
            if history is not None and len(history) >= self._min:
                return max(1, round(statistics.median(history)))
        return self._default

    def ready(self, task: TaskType, prompt_tokens: int) -> bool:
        cell = self._cells.get((task, prompt_bucket(prompt_tokens)))
        return cell is not None and len(cell) >= self._min


@dataclass(slots=True)
class CostModel:
    """Cost proxies t_ttft = base + per-token prefill, and t_tpot, tracked as EWMAs.

    ``observe`` takes prefill time measured from dispatch, not arrival: queueing delay is a
    consequence of the ordering policy, and folding it into the proxy would feed it back.
    """

    prefill_base_s: float = 0.02
    prefill_per_token_s: float = 0.0002
    tpot_s: float = 0.03
    smoothing: float = 0.1

    def ttft(self, prompt_tokens: int) -> float:
        return self.prefill_base_s + self.prefill_per_token_s * prompt_tokens

    def observe(self, prompt_tokens: int, prefill_s: float, tpot_s: float | None) -> None:
        a = self.smoothing
        if prompt_tokens > 0:
            per_token = max(0.0, prefill_s - self.prefill_base_s) / prompt_tokens
            self.prefill_per_token_s += a * (per_token - self.prefill_per_token_s)
        if tpot_s is not None:
            self.tpot_s += a * (tpot_s - self.tpot_s)


class LengthBound(Protocol):
    """Turns a prediction into an upper bound (the conformal calibrator in admission.py)."""

    def upper(self, prompt_tokens: int, l_pred: int) -> int: ...


@dataclass(frozen=True, slots=True)
class RequestSpec:
    """What the gateway knows about a new request before perception."""

    request_id: str
    tenant: str
    arrival_s: float
    prompt: str
    prompt_tokens: int
    importance: float = 0.75
    priority: int = 0
    task: TaskType | None = None
    slo: Slo | None = None


@dataclass
class Perceiver:
    """Builds a ``QueuedRequest`` from a ``RequestSpec``; a caller-given task or SLO wins."""

    tagger: TaskTagger
    lengths: LengthPredictor
    costs: CostModel
    slos: SloTable
    bound: LengthBound

    def perceive(self, spec: RequestSpec) -> QueuedRequest:
        task = spec.task if spec.task is not None else self.tagger.tag(spec.prompt)
        l_pred = self.lengths.predict(task, spec.prompt_tokens)
        return QueuedRequest(
            request_id=spec.request_id,
            tenant=spec.tenant,
            arrival_s=spec.arrival_s,
            prompt_tokens=spec.prompt_tokens,
            task=task,
            importance=spec.importance,
            slo=self.slos.resolve(task, spec.importance, spec.tenant, spec.slo),
            l_pred=l_pred,
            l_upper=self.bound.upper(spec.prompt_tokens, l_pred),
            ttft_pred_s=self.costs.ttft(spec.prompt_tokens),
            tpot_pred_s=self.costs.tpot_s,
            priority=spec.priority,
        )
