"""A context's segments on the vLLM worker: turns tokenize as the chat request would, with
SmolLM2's tokenizer and both its own and the bundled template; a template that cannot be
cut into turns is an error."""

from __future__ import annotations

from typing import Any

import pytest

from daemon.engines.vllm import tools
from daemon.engines.vllm.segments import SegmentTokenizer, TemplateError
from daemon.workers.protocol import ChatMessage, Segment
from tests.vllm_support import MODEL_DIR, _require_vllm


@pytest.fixture(scope="module")
def tok() -> Any:
    _require_vllm()
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(MODEL_DIR))


def _chat_ids(tok: Any, messages: list[ChatMessage], template: str | None) -> list[int]:
    return list(tok.encode(tools.render(tok, messages, None, template), add_special_tokens=False))


@pytest.mark.parametrize("template", [None, "chatml-tools"])
def test_turns_then_a_reply_are_the_chat_prompt(tok: Any, template: str | None) -> None:
    text = tools.chat_template(template or "")
    segments = SegmentTokenizer(tok, text)
    for first in ("system", "user"):
        turns = [(first, "You answer in one word."), ("user", "Capital of France?"),
                 ("assistant", "Paris"), ("user", "And of Italy?")]
        ids = segments.token_ids([Segment(kind="turn", role=r, text=t) for r, t in turns]
                                 + [Segment(kind="reply")], context_empty=True)
        assert ids == _chat_ids(tok, [ChatMessage(r, t) for r, t in turns], text)


def test_segments_append_without_retokenizing(tok: Any) -> None:
    segments = SegmentTokenizer(tok, None)
    head = segments.token_ids([Segment(kind="turn", role="user", text="hi")], True)
    more = segments.token_ids([Segment(kind="text", text=" plain"),
                               Segment(kind="turn", role="user", text="again")], False)
    assert more[:len(tok.encode(" plain"))] == tok.encode(" plain", add_special_tokens=False)
    assert not tok.decode(more).startswith("<|im_start|>system")  # no opening mid-context
    assert head[:1] == tok.encode("<|im_start|>", add_special_tokens=False)


def test_a_template_that_rewrites_history_is_refused(tok: Any) -> None:
    # Renders only the last message: a conversation is not its first messages plus more.
    template = "{{ messages[-1]['content'] }}"
    with pytest.raises(TemplateError, match="cannot append turns"):
        SegmentTokenizer(tok, template).token_ids(
            [Segment(kind="turn", role="user", text="x")], context_empty=False)


def test_unknown_kind(tok: Any) -> None:
    with pytest.raises(ValueError, match="unknown segment kind"):
        SegmentTokenizer(tok, None).token_ids([Segment(kind="poem")], True)
