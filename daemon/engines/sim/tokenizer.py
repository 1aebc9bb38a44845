"""A deterministic tokenizer and chat template for the simulated engine.

Text is split into words (``\\w+``) and single punctuation characters; each piece maps to an id
by a keyed BLAKE2b digest, so ids are identical in every process and every run (Python's
``hash()`` of a str is salted per process and would break prefix reuse between workers). It is
not a real BPE: counts come out near one token per word, somewhat below a real tokenizer.

The chat template is fixed and marker-delimited. A previous assistant turn renders exactly as
the generation prompt followed by the generated text, so a multi-turn conversation that sends
back the sim's own output re-tokenizes to the same ids, and its prefix (decode blocks included)
is reused as it would be on a real engine.

Generated text is filler labelled as simulated: output token ``i`` is the word ``sim<i>``.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from functools import lru_cache

from daemon.workers.protocol import ChatMessage, Segment, Tools

SPECIAL_TOKENS = ("<|bos|>", "<|system|>", "<|user|>", "<|assistant|>", "<|tool|>", "<|end|>")
VOCAB_SIZE = 128_256
_SPECIAL_IDS = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
_NUM_SPECIAL = len(SPECIAL_TOKENS)
_PIECE = re.compile(r"<\|[a-z]+\|>|\w+|[^\w\s]")
_ROLE_MARKER = {"system": "<|system|>", "user": "<|user|>", "assistant": "<|assistant|>",
                "tool": "<|tool|>"}


@lru_cache(maxsize=1 << 17)
def piece_id(piece: str) -> int:
    special = _SPECIAL_IDS.get(piece)
    if special is not None:
        return special
    digest = hashlib.blake2b(piece.encode(), digest_size=8, key=b"agentd-sim").digest()
    return _NUM_SPECIAL + int.from_bytes(digest, "little") % (VOCAB_SIZE - _NUM_SPECIAL)


def encode(text: str) -> list[int]:
    return [piece_id(p) for p in _PIECE.findall(text)]


def count_tokens(text: str) -> int:
    return len(_PIECE.findall(text))


def render_chat(messages: Sequence[ChatMessage], tools: Tools | None = None) -> str:
    """The prompt text for ``messages``, ending with the assistant generation marker. The
    tools' specs open it; an assistant turn's calls follow its content as the sim writes
    them (``call_text``), so a history that sends a call back re-tokenizes to its ids."""
    parts = ["<|bos|>"]
    if tools is not None:
        parts.append(f"<|system|> tools: {tools.functions} <|end|>")
    for m in messages:
        calls = "".join(call_text(c.name, c.arguments) for c in m.tool_calls)
        parts.append(f"{_ROLE_MARKER.get(m.role, '<|user|>')} {m.content}{calls} <|end|>")
    parts.append("<|assistant|>")
    return "\n".join(parts)


def segment_text(segment: Segment, opens: bool) -> str:
    """A context segment's text as ``render_chat`` would write it, so a context of turns
    tokenizes as the same chat does; ``opens``: the first segment of an empty context."""
    if segment.kind == "text":
        return segment.text
    if segment.kind == "reply":
        return "<|assistant|>"
    if segment.kind != "turn":
        raise ValueError(f"unknown segment kind {segment.kind!r}")
    turn = f"{_ROLE_MARKER.get(segment.role, '<|user|>')} {segment.text} <|end|>"
    return f"<|bos|>\n{turn}" if opens else turn


def segment_ids(segments: Sequence[Segment], context_empty: bool) -> list[int]:
    """The ids ``segments`` append to a context (``context_empty``: it holds no token yet)."""
    ids: list[int] = []
    for segment in segments:
        ids.extend(encode(segment_text(segment, opens=context_empty and not ids)))
    return ids


def call_text(name: str, arguments: str) -> str:
    """A function call as the sim writes it (the Hermes format vLLM's hermes parser reads)."""
    return f'<tool_call>{{"name": "{name}", "arguments": {arguments}}}</tool_call>'


_SPACED_PIECE = re.compile(r"\s*(?:<\|[a-z]+\|>|\w+|[^\w\s])")


def split(text: str) -> list[str]:
    """``text`` cut into its tokens' texts, each with the whitespace before it, so they join
    back to ``text`` (trailing whitespace stays with the last) and ``encode`` gives their ids."""
    pieces = _SPACED_PIECE.findall(text)
    tail = len(text) - sum(map(len, pieces))
    if pieces and tail:
        pieces[-1] += text[-tail:]
    return pieces


def filler_token_id(index: int) -> int:
    return piece_id(f"sim{index}")


def filler_text(index: int, first: bool) -> str:
    """Text of output token ``index``; tokens after the first carry their separating space."""
    return f"sim{index}" if first else f" sim{index}"
