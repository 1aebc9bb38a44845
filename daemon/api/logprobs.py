"""Token log probabilities in OpenAI's two shapes.

The engines return, per output token, its text, its log probability and the likeliest
alternatives (protocol.TokenLogprob). Chat completions list them as `content` entries
with UTF-8 bytes; text completions (the legacy API) as parallel lists with each token's
offset in the text.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from daemon.workers.protocol import TokenLogprob

# vLLM's default max_logprobs: an engine refuses more alternatives than this.
MAX_TOP_LOGPROBS = 20


def chat_logprobs(tokens: Sequence[TokenLogprob]) -> dict[str, Any]:
    return {"content": [_chat_entry(t) for t in tokens], "refusal": None}


def _chat_entry(token: TokenLogprob) -> dict[str, Any]:
    return {
        "token": token.token, "logprob": token.logprob, "bytes": list(token.token.encode()),
        "top_logprobs": [{"token": t.token, "logprob": t.logprob, "bytes": list(t.token.encode())}
                         for t in token.top],
    }


def completion_logprobs(tokens: Sequence[TokenLogprob], offset: int = 0) -> dict[str, Any]:
    """`offset`: where the first token starts in the completion's text (in a stream, the
    characters already sent)."""
    offsets = []
    for t in tokens:
        offsets.append(offset)
        offset += len(t.token)
    return {
        "tokens": [t.token for t in tokens],
        "token_logprobs": [t.logprob for t in tokens],
        "top_logprobs": [{top.token: top.logprob for top in t.top} for t in tokens],
        "text_offset": offsets,
    }
