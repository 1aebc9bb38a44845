"""The meta-llm selector's call to a served model (scheduling/slo/meta_llm.py decides).

After each decision of an LLM meta policy the daemon asks a served model about the view
that decision saw, through its own engine path: an internal program in the session and
tenant `agentd-internal`, at low priority, with a small max_tokens, the reply's JSON
schema (engines that support structured output follow it; the sim ignores it) and a
timeout. The call is an asyncio task: the meta tick never waits for it and decides on the
last answer that came in, which is one meta interval old, or on the rule map when there
is none yet (`pending`), the call timed out (`timeout`), no healthy worker serves the
model (`no_worker`) or the call failed (`error`); a reply that is not the strict JSON
decision is `invalid`. Every decision is a `meta.llm` trace event saying which, with the
request that produced its answer.

The internal call is a real request (queued, ordered, admitted, in the session's trace),
but it stays out of the SLO views and counters: the daemon's own question is not service
to a tenant, and a late one must not look like an unfair share to the rule map.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections import Counter
from typing import TYPE_CHECKING, Any

from daemon.access.names import INTERNAL_TENANT
from daemon.core.tenants import open_program
from daemon.errors import CoreError
from daemon.slo.tables import LlmSettings
from daemon.state import RequestState
from daemon.workers.protocol import ChatMessage, SamplingParams
from scheduling.slo.meta import LlmOutcome
from scheduling.slo.meta_llm import LlmMeta

if TYPE_CHECKING:
    from daemon.core.core import Core

log = logging.getLogger("agentd.slo")
LOW_PRIORITY = -2  # importance 0.5, the laxest SLO; strict priority serves it last
INTERNAL_SESSION = INTERNAL_TENANT
PROGRAM_PREFIX = "agentd-meta-llm"
DEFAULT_TIMEOUT_SHARE = 0.8  # of the meta interval, when [slo.llm] timeout_s is 0

# (outcome kind, detail, reply text or None)
Answer = tuple[str, str, str | None]


class LlmCaller:
    def __init__(self, core: Core, settings: LlmSettings, interval_s: float) -> None:
        self.core = core
        self.settings = settings
        self.timeout_s = settings.timeout_s or DEFAULT_TIMEOUT_SHARE * interval_s
        self.outcomes: Counter[str] = Counter()
        self._task: asyncio.Task[None] | None = None
        self._started = 0.0
        self._seen: LlmOutcome | None = None
        # The call whose answer a policy's next decision reads, with that policy (another
        # version may have taken over meanwhile).
        self._delivered: tuple[object, dict[str, Any]] | None = None
        # One program for every call, kept across restarts (the store has it, ACTING
        # between calls), so the daemon's questions do not pile up programs.
        self._program_id = PROGRAM_PREFIX

    @property
    def in_flight(self) -> bool:
        return self._task is not None and not self._task.done()

    def after_tick(self, policy: Any) -> None:
        """After a meta tick: trace the decision it made, if it made one, and ask the model
        about its view for the next one (unless the last call is still out)."""
        if not isinstance(policy, LlmMeta):
            return
        outcome = policy.outcome
        if outcome is None or outcome is self._seen:
            return
        self._seen = outcome
        self._trace(policy, outcome)
        if self.in_flight:
            return
        try:
            prompt, schema = policy.prompt(), policy.schema()
        except Exception as exc:  # an operator's subclass: no call, and the next decision says why
            log.exception("meta-llm policy could not build its prompt")
            policy.on_failure("error", f"prompt failed: {type(exc).__name__}: {exc}")
            return
        if prompt is not None:
            self._started = time.monotonic()
            self._task = asyncio.get_running_loop().create_task(
                self._ask(policy, prompt, schema), name="meta-llm-call")

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    def status(self) -> dict[str, Any]:
        return {"model": self.settings.model or None, "timeout_s": self.timeout_s,
                "in_flight": self.in_flight, "outcomes": dict(self.outcomes)}

    def _trace(self, policy: LlmMeta, outcome: LlmOutcome) -> None:
        self.outcomes[outcome.kind] += 1
        if self._delivered is not None and self._delivered[0] is policy:
            call = self._delivered[1]
        elif self.in_flight:
            call = {"running_s": round(time.monotonic() - self._started, 3)}
        else:
            call = {}
        self._delivered = None
        d = outcome.decision
        self.core.writer.trace("meta.llm", outcome=outcome.kind, detail=outcome.detail,
                               policy=d.policy_name, reason=d.reason, **call)

    async def _ask(self, policy: LlmMeta, prompt: str, schema: dict[str, Any]) -> None:
        call: dict[str, Any] = {}
        try:
            kind, detail, text = await self._call(prompt, schema, call)
        except Exception as exc:  # whatever went wrong, the rules decide and the trace says why
            log.exception("meta-llm call failed")
            kind, detail, text = "error", f"{type(exc).__name__}: {exc}", None
        call["latency_s"] = round(time.monotonic() - self._started, 3)
        self._delivered = (policy, call)
        if text is not None:
            policy.on_response(text)
        else:
            policy.on_failure(kind, detail)

    async def _call(self, prompt: str, schema: dict[str, Any], call: dict[str, Any]) -> Answer:
        model = self._model()
        if model is None:
            wanted = f"model {self.settings.model!r}" if self.settings.model else "any model"
            return "no_worker", f"no healthy worker serves {wanted}", None
        try:
            program = await open_program(self.core, self._program_id, INTERNAL_SESSION,
                                         INTERNAL_TENANT)
            sampling = SamplingParams(max_tokens=self.settings.max_tokens, temperature=0.0,
                                      json_schema=json.dumps(schema))
            req = self.core.submit(program, "chat", model, sampling, priority=LOW_PRIORITY,
                                   messages=[ChatMessage(role="user", content=prompt)])
        except CoreError as exc:  # e.g. an operator released the program: take a new one
            self._program_id = f"{PROGRAM_PREFIX}-{uuid.uuid4().hex[:8]}"
            return "error", str(exc), None
        call.update(model=model, request_id=req.id)
        try:
            return await asyncio.wait_for(_reply(req), self.timeout_s)
        except TimeoutError:
            await self.core.abort(req.id, "meta-llm call timed out")
            return "timeout", f"no answer within {self.timeout_s:.2f}s", None

    def _model(self) -> str | None:
        served = sorted({w.model for w in self.core.workers.values() if w.healthy})
        if self.settings.model:
            return self.settings.model if self.settings.model in served else None
        return served[0] if served else None


async def _reply(req: RequestState) -> Answer:
    parts: list[str] = []
    while True:
        item = await req.stream.get()
        if item.error is not None:
            return "error", item.error, None
        if item.finish is not None:
            return "replied", "", "".join(parts)
        parts.append(item.text)
