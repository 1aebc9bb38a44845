"""Storing what a request said and answered, for the tenants that trace content.

As a request ends (finished, failed or aborted), its prompt (the chat messages, the
prompt text, or a context's new segments), its completion and its tool calls' arguments
are redacted (`content_redact`) and cut (`content_max_chars` a field, with a marker
saying how much was cut), and enqueued on the batched writer as one `request_contents`
row: the event loop does a bounded amount of string work and never waits on disk. A
tenant whose tracing is off (the default) costs one dict lookup per request.

Redaction runs on a little more than what is kept, so a secret that straddles the cut is
still matched as a whole and no prefix of it survives.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import msgspec

from daemon.access.names import DEFAULT_TENANT
from daemon.content.settings import REDACTED, ContentSettings

if TYPE_CHECKING:
    from daemon.state import RequestState
    from daemon.workers.protocol import Finish

REDACT_MARGIN = 256  # characters past the cut that redaction still reads


def cut_marker(dropped: int) -> str:
    return f"…[truncated {dropped} chars]"


class Redactor:
    def __init__(self, settings: ContentSettings) -> None:
        self.settings = settings
        self.redactions = 0
        self.truncated = False

    def text(self, value: str, budget: int | None = None) -> str:
        """`value` redacted and cut to `budget` characters (default: the field cap)."""
        keep = self.settings.max_chars if budget is None else budget
        window = value[:keep + REDACT_MARGIN]
        for pattern in self.settings.redact:
            window, n = pattern.subn(REDACTED, window)
            self.redactions += n
        if len(window) <= keep and len(value) <= keep + REDACT_MARGIN:
            return window
        self.truncated = True
        # what is dropped: the redacted window's rest, and what lay past the window
        dropped = max(len(window) - keep, 0) + max(len(value) - keep - REDACT_MARGIN, 0)
        return window[:keep] + cut_marker(max(dropped, 1))


def prompt_of(req: RequestState, redactor: Redactor) -> dict[str, Any]:
    """The prompt as JSON. Chat messages share one cap, the newest kept first: the
    earlier turns of an agent loop repeat in every request of its program, and the new
    turn is what this request adds."""
    if req.messages is not None:
        budget = redactor.settings.max_chars
        kept: list[dict[str, Any]] = []
        for message in reversed(req.messages):
            turn = msgspec.to_builtins(message)
            turn["content"] = redactor.text(message.content, max(budget, 0))
            budget -= len(message.content)
            for call in turn.get("tool_calls", []):
                call["arguments"] = redactor.text(call["arguments"])
            kept.append(turn)
        return {"messages": kept[::-1]}
    if req.prompt is not None:
        return {"prompt": redactor.text(req.prompt)}
    if req.segments:
        text = "".join(s.text for s in req.segments)
        return {"segments": redactor.text(text),
                "prompt_token_ids": len(req.prompt_token_ids or [])}
    return {"prompt_token_ids": len(req.prompt_token_ids or [])}


def content_row(req: RequestState, finish: Finish | None, settings: ContentSettings,
                now: float) -> dict[str, Any]:
    redactor = Redactor(settings)
    reply = finish.reply if finish is not None else None
    completion = reply.content or "" if reply is not None else req.text_so_far
    calls = [{"id": c.id, "name": c.name, "arguments": redactor.text(c.arguments)}
             for c in (reply.tool_calls if reply is not None else [])]
    return {
        "request_id": req.id, "session_id": req.session_id, "program_id": req.program_id,
        "prompt": prompt_of(req, redactor), "completion": redactor.text(completion),
        "tool_calls": calls, "truncated": redactor.truncated,
        "redactions": redactor.redactions, "created_at": now,
    }


class ContentCapture:
    """Follows request ends (core.on_request_end) and stores the content of those whose
    tenant traces content."""

    def __init__(self, settings: ContentSettings, tenant_of: Callable[[str], str | None],
                 insert: Callable[[str, dict[str, Any]], None],
                 clock: Callable[[], float]) -> None:
        self.settings = settings
        self._tenant_of = tenant_of  # a program's tenant
        self._insert = insert
        self._clock = clock
        self.stored = 0

    def request_ended(self, req: RequestState, finish: Finish | None) -> None:
        tenant = self._tenant_of(req.program_id) or DEFAULT_TENANT
        if not self.settings.traces(tenant):
            return
        self._insert("request_contents", content_row(req, finish, self.settings,
                                                     self._clock()))
        self.stored += 1
