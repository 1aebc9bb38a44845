"""The LLM meta selector as a meta-layer policy (``meta-llm``).

``choose`` never waits for a model: it decides on the last answer the daemon handed over
(``on_response``), or on the rule map when there is none or it is invalid
(``scheduling.slo.meta.LlmSelector``). The daemon (daemon/slo/llm.py) asks the model after
each decision, about the view that decision saw, with ``prompt()`` and ``schema()``, and
reads ``outcome`` for the trace.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from scheduling.slo.meta import (
    Decision,
    LlmOutcome,
    LlmSelector,
    MetaPolicy,
    RuleMap,
    RuleThresholds,
)
from scheduling.slo.ordering import default_registry
from scheduling.slo.views import LongView

# Short enough that the longest reply fits the call's max_tokens even at one token per
# character: SmolLM2 held to the schema has been seen looping inside the reason ("_esg_esg...")
# until max_tokens cut the JSON off.
REASON_MAX_CHARS = 80


class LlmMeta(MetaPolicy):
    name = "meta-llm"

    def __init__(self, thresholds: RuleThresholds | None = None, initial: str = "fcfs",
                 pool: Sequence[str] | None = None) -> None:
        names = tuple(pool) if pool is not None else default_registry().names()
        self.selector = LlmSelector(names, RuleMap(initial, thresholds))

    def choose(self, view: LongView, now: float) -> Decision:
        return self.selector.choose(view, now)

    def on_applied(self, policy_name: str) -> None:
        self.selector.on_applied(policy_name)

    def prompt(self) -> str | None:
        """The question about the view of the latest decision; None before the first."""
        view = self.selector.last_view
        return None if view is None else self.selector.build_prompt(view)

    def schema(self) -> dict[str, Any]:
        """The reply's JSON schema, for engines that can constrain their output to one."""
        return {"type": "object", "additionalProperties": False,
                "required": ["policy", "reason"],
                "properties": {"policy": {"type": "string", "enum": list(self.selector.pool)},
                               "reason": {"type": "string", "minLength": 1,
                                          "maxLength": REASON_MAX_CHARS}}}

    def on_response(self, text: str) -> None:
        self.selector.on_response(text)

    def on_failure(self, kind: str, detail: str) -> None:
        self.selector.on_failure(kind, detail)

    @property
    def outcome(self) -> LlmOutcome | None:
        return self.selector.outcome
