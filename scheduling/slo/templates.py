"""Task taxonomy and per-task SLO templates.

The baseline targets are Table 6 of the H-MAS paper (Appendix E.5, "Baseline per-task
SLO templates"); the importance scaling is its Eq. 14: a clipped linear factor
f(imp) in [1 - alpha, 1 + alpha], alpha = 0.2, where a more important request gets a
*smaller* factor and so a stricter target. The paper calls the table "a reproducible
template ... rather than an oracle", so every entry can be overridden per tenant and
per request.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

IMPORTANCE_MIN = 0.5
IMPORTANCE_MAX = 1.0
IMPORTANCE_ALPHA = 0.2


class TaskType(StrEnum):
    """The fixed taxonomy of Table 6, plus ``unknown`` for low-confidence tags."""

    QA = "qa"
    DIALOGUE = "dialogue"
    TRANSLATION = "translation"
    EXTRACTION = "extraction"
    PARAPHRASING = "paraphrasing"
    CODE_GENERATION = "code_generation"
    INSTRUCTION_FOLLOWING = "instruction_following"
    SUMMARIZATION = "summarization"
    LETTER_DRAFTING = "letter_drafting"
    MATH_REASONING = "math_reasoning"
    ESSAY_GENERATION = "essay_generation"
    LONG_FORM_GENERATION = "long_form_generation"
    RESEARCH = "research_and_communication"
    UNKNOWN = "unknown"


@dataclass(frozen=True, slots=True)
class Slo:
    """A latency objective: time to first token and time per output token, seconds."""

    ttft_s: float
    tpot_s: float


def _ms(ttft_ms: int, tpot_ms: int) -> Slo:
    return Slo(ttft_ms / 1000.0, tpot_ms / 1000.0)


# H-MAS Table 6. ``unknown`` takes the InstructionFollowing row, the table's median: the
# paper (Sec. 3.2) falls back to a coarse prior rather than a semantic guess.
TABLE_6: Mapping[TaskType, Slo] = {
    TaskType.QA: _ms(4000, 70),
    TaskType.DIALOGUE: _ms(4000, 70),
    TaskType.TRANSLATION: _ms(4500, 80),
    TaskType.EXTRACTION: _ms(6000, 80),
    TaskType.PARAPHRASING: _ms(6000, 90),
    TaskType.CODE_GENERATION: _ms(6000, 90),
    TaskType.INSTRUCTION_FOLLOWING: _ms(6000, 100),
    TaskType.SUMMARIZATION: _ms(7000, 110),
    TaskType.LETTER_DRAFTING: _ms(8000, 120),
    TaskType.MATH_REASONING: _ms(10000, 130),
    TaskType.ESSAY_GENERATION: _ms(10000, 130),
    TaskType.LONG_FORM_GENERATION: _ms(12000, 150),
    TaskType.RESEARCH: _ms(13000, 150),
    TaskType.UNKNOWN: _ms(6000, 100),
}


def importance_factor(importance: float, alpha: float = IMPORTANCE_ALPHA) -> float:
    """Eq. 14's f(imp): 1 + alpha at imp = 0.5 down to 1 - alpha at imp = 1."""
    imp = min(IMPORTANCE_MAX, max(IMPORTANCE_MIN, importance))
    span = IMPORTANCE_MAX - IMPORTANCE_MIN
    return 1.0 + alpha - 2.0 * alpha * (imp - IMPORTANCE_MIN) / span


def scale_slo(base: Slo, importance: float) -> Slo:
    """Apply f(imp), flooring to whole milliseconds as Eq. 14 does."""
    f = importance_factor(importance)
    return Slo(_floor_ms(base.ttft_s * f), _floor_ms(base.tpot_s * f))


def _floor_ms(seconds: float) -> float:
    # The epsilon keeps 4000 ms * 0.8 from flooring to 3199 through float error.
    return math.floor(seconds * 1000.0 + 1e-6) / 1000.0


@dataclass(frozen=True, slots=True)
class SloTable:
    """Resolves a request's SLO: request override > tenant override > Table 6."""

    base: Mapping[TaskType, Slo] = field(default_factory=lambda: dict(TABLE_6))
    tenant_overrides: Mapping[str, Mapping[TaskType, Slo]] = field(default_factory=dict)

    def resolve(
        self,
        task: TaskType,
        importance: float,
        tenant: str | None = None,
        override: Slo | None = None,
    ) -> Slo:
        # An explicit per-request SLO is the client's contract: importance does not rescale it.
        if override is not None:
            return override
        return scale_slo(self._base_for(task, tenant), importance)

    def _base_for(self, task: TaskType, tenant: str | None) -> Slo:
        per_tenant = self.tenant_overrides.get(tenant, {}) if tenant is not None else {}
        if task in per_tenant:
            return per_tenant[task]
        return self.base.get(task, TABLE_6[TaskType.UNKNOWN])
