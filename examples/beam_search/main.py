"""A beam search the program runs itself, token by token, with Context.step and append.

`step()` is the next token's distribution on a context (its `top` likeliest token ids with
log probabilities; the prompt comes from the engine's prefix cache, so a step costs about
one token); the program scores, prunes and extends its beams with `fork` and `append`, and
stops a beam on its own condition (an end-of-turn token, or a stop word of the caller).
Beam width 1 is greedy decoding, token for token what `generate(temperature=0)` gives.

On a daemon with the simulated engine (its distributions are simulated) or the real
SmolLM2 worker (examples/router says how to start either):

    agentctl submit examples/beam_search --follow \\
        --args '{"prompt": "Name three colours of the rainbow.", "width": 3}'
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import agentd

# Token texts that end a reply: SmolLM2's end of turn and end of text, the sim's end marker.
END_TEXTS = frozenset({"<|im_end|>", "<|endoftext|>", "<|end|>"})


@dataclass
class Beam:
    ctx: agentd.Context
    logprob: float = 0.0
    tokens: list[str] = field(default_factory=list)
    done: bool = False

    def score(self, length_penalty: float) -> float:
        scale: float = pow(float(max(1, len(self.tokens))), length_penalty)
        return self.logprob / scale


def expand(beam: Beam, width: int, stop: str | None) -> list[Beam]:
    """The beam's `width` likeliest continuations, each a fork with one more token."""
    children = []
    for cand in beam.ctx.step(top=width):
        ctx = beam.ctx.fork(1)[0].append([cand.token_id])
        tokens = [*beam.tokens, cand.token]
        ended = cand.token in END_TEXTS or (stop is not None and stop in "".join(tokens))
        children.append(Beam(ctx, beam.logprob + cand.logprob, tokens, ended))
    beam.ctx.drop()
    return children


def main(prompt: str, width: int = 3, max_tokens: int = 16, stop: str | None = None,
         length_penalty: float = 1.0) -> dict[str, Any]:
    root = agentd.Context().user(prompt)
    beams = [Beam(root)]
    steps = 0
    while steps < max_tokens and not all(b.done for b in beams):
        grown = [b for b in beams if b.done]
        for beam in beams:
            if not beam.done:
                grown.extend(expand(beam, width, stop))
        beams = sorted(grown, key=lambda b: -b.logprob)[:width]
        steps += 1
    ranked = sorted(beams, key=lambda b: -b.score(length_penalty))
    return {"text": "".join(t for t in ranked[0].tokens if t not in END_TEXTS),
            "beams": [{"text": "".join(b.tokens), "logprob": round(b.logprob, 4),
                       "finished": b.done} for b in ranked],
            "steps": steps}
