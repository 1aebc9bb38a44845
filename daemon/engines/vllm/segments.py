"""A context's segments as token ids, through the tokenizer and its chat template.

A context (agentd.Context) is kept as token ids; what it appends before a generate comes as
segments the worker tokenizes, because the tokenizer and the chat template live here. Each
segment is tokenized on its own and appended, so the ids already in the context are never
re-tokenized.

A chat turn is the text the template adds for one more message: rendered after a reference
system message, minus the reference's own rendering. The first turn of an empty context is
rendered whole, so it carries the template's opening (and, for a template that adds a
default system prompt before a first user turn, that prompt): a context of turns then
tokenizes exactly as the same chat request does. A template whose rendering of two messages
does not start with its rendering of the first cannot be cut into turns; it is an error
naming the template, never a guess.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from daemon.workers.protocol import Segment

_REFERENCE = {"role": "system", "content": "agentd reference turn"}


class TemplateError(ValueError):
    """The chat template cannot render a segment incrementally."""


class SegmentTokenizer:
    def __init__(self, tokenizer: Any, template: str | None) -> None:
        self._tok = tokenizer
        self._template = template

    def token_ids(self, segments: Sequence[Segment], context_empty: bool) -> list[int]:
        ids: list[int] = []
        for segment in segments:
            text = self.text(segment, opens=context_empty and not ids)
            ids.extend(self._tok.encode(text, add_special_tokens=False))
        return ids

    def text(self, segment: Segment, opens: bool) -> str:
        if segment.kind == "text":
            return segment.text
        if segment.kind == "reply":
            return self._after([_REFERENCE], [_REFERENCE], generation_prompt=True)
        if segment.kind != "turn":
            raise ValueError(f"unknown segment kind {segment.kind!r}")
        message = {"role": segment.role, "content": segment.text}
        if opens:
            return self._render([message], generation_prompt=False)
        return self._after([_REFERENCE], [_REFERENCE, message], generation_prompt=False)

    def _after(self, before: list[dict[str, str]], after: list[dict[str, str]],
               generation_prompt: bool) -> str:
        """What rendering `after` adds to rendering `before` (without a generation prompt)."""
        head = self._render(before, generation_prompt=False)
        whole = self._render(after, generation_prompt=generation_prompt)
        if not whole.startswith(head):
            raise TemplateError("the chat template does not render a conversation as its "
                                "first messages' rendering plus more, so a context cannot "
                                "append turns to it; append text segments instead")
        return whole[len(head):]

    def _render(self, messages: list[dict[str, str]], generation_prompt: bool) -> str:
        return str(self._tok.apply_chat_template(
            messages, chat_template=self._template, tokenize=False,
            add_generation_prompt=generation_prompt))
