"""What a replay runs: programs made of LLM steps separated by tool time, with token ids.

Token ids are built so the simulated engine's prefix cache sees the sharing the trace
describes and nothing more. Block hashes chain on their parent, so only the first block
of a sequence needs content unique to its owner: every segment starts with a distinct
marker token and is padded with a constant. That keeps a 40k-token context cheap (Python
caches small ints) while equal prefixes still hash equal and different ones never do.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

FILL_TOKEN = 7
# Marker ids live above the sim tokenizer's small ids and below its vocabulary size.
_MARKER_BASE = 1_000
_MARKER_SPAN = 120_000
BLOCK_TOKENS = 512


@dataclass(frozen=True, slots=True)
class StepSpec:
    """One LLM call. ``new_tokens`` of the prompt are new relative to the previous
    step's full context (prompt + output); the rest is that context's prefix.
    ``tool_s`` is the tool time between the previous step's end and this step's arrival."""

    prompt_tokens: int
    output_tokens: int
    new_tokens: int
    tool_s: float = 0.0
    # A prompt given as content-addressed blocks (Mooncake hash ids, BLOCK_TOKENS each);
    # None = derive it from the program's context and markers.
    block_ids: tuple[int, ...] | None = None


@dataclass(frozen=True, slots=True)
class ProgramSpec:
    program_id: str
    arrival_s: float
    steps: tuple[StepSpec, ...]
    tenant: str = "default"
    task: str | None = None  # a TaskType value for the SLO layer; None = tag as unknown
    prefix_group: str | None = None  # programs whose first prompt shares a system prompt
    prefix_tokens: int = 0
    meta: dict[str, str] = field(default_factory=dict)

    @property
    def total_output_tokens(self) -> int:
        return sum(s.output_tokens for s in self.steps)


def marker(*parts: object) -> int:
    """A deterministic token id for one segment owner (stable across processes)."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return _MARKER_BASE + int.from_bytes(digest, "little") % _MARKER_SPAN


def segment(n: int, *owner: object) -> list[int]:
    """``n`` token ids whose first one names ``owner``."""
    if n <= 0:
        return []
    return [marker(*owner)] + [FILL_TOKEN] * (n - 1)


def first_prompt(spec: ProgramSpec) -> list[int]:
    """The first prompt: the group's shared prefix (if any), then program-owned tokens."""
    step = spec.steps[0]
    if step.block_ids is not None:
        return block_prompt(spec, step)
    shared = min(spec.prefix_tokens, step.prompt_tokens) if spec.prefix_group else 0
    ids = segment(shared, "group", spec.prefix_group)
    return ids + segment(step.prompt_tokens - shared, "prog", spec.program_id, 0)


def next_prompt(spec: ProgramSpec, index: int, context: list[int]) -> tuple[list[int], int]:
    """Prompt ids of step ``index`` and how many leading ids it shares with ``context``."""
    step = spec.steps[index]
    if step.block_ids is not None:
        return block_prompt(spec, step), 0
    shared = max(0, min(step.prompt_tokens - step.new_tokens, len(context)))
    ids = context[:shared] + segment(step.prompt_tokens - shared, "prog", spec.program_id, index)
    return ids, shared


def block_prompt(spec: ProgramSpec, step: StepSpec) -> list[int]:
    """Equal block ids give equal ids block by block; the tail past the blocks is owned."""
    assert step.block_ids is not None
    ids = [t for b in step.block_ids for t in segment(BLOCK_TOKENS, "blk", b)]
    ids += segment(step.prompt_tokens - len(ids), "tail", spec.program_id)
    return ids[: step.prompt_tokens]
