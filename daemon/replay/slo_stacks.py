"""The SLO stacks a replay can run, by name, and the settings they share.

A pool policy (``fcfs``, ``sjf``, ``edf``, ``two_lane``, ``esg`` ...) runs fixed;
``meta-rules`` / ``meta-bandit`` / ``meta-llm`` switch among the pool; ``full`` is
meta-rules plus the admission fence, both control loops and online length prediction with
conformal bounds. It starts in ``esg_fast`` (ESG density, every other dispatch to the
shortest request that can still meet its TTFT) and its two-lane policy is
``two_lane_esg``: requests that lost their TTFT no longer count for goodput, only for ESG,
so its late queue is ordered by ESG density instead of oldest first.
Ablations of ``full`` (H-MAS Table 2): ``full-no-two-lane`` (both two-lanes out of the
pool, SJF first), ``full-frozen-statera`` (fence on, loops frozen at their maximum),
``full-no-meta`` (FCFS fixed, as the paper's "Disable Meta (FCFS)"),
``full-rule-prediction`` (no online length learning: every request gets the predictor's
default length and the bound stays at the token cap); and ``full-fifo-late`` (plain
``two_lane``, late queue oldest first: the ESG-aware late queue's ablation) and
``full-lanes-first`` (starts in ``two_lane_esg``: the initial policy's ablation).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from scheduling.slo.meta import SERVING_GUARD, SERVING_RULES
from scheduling.slo.ordering import default_registry

POOL = default_registry().names()
BANDIT_ARMS = ("fcfs", "sjf", "edf", "two_lane")
# H-MAS Algorithm 1 starts from SJF; two-lane (with its late queue) loses less when the
# first meta interval is spent under a load SJF handles badly (see bench/slo.py).
META_INITIAL = "two_lane"
FULL_LANES = "two_lane_esg"
# The full stack's policy until the first long view: a burst can arrive and be queued
# within one meta interval (the conversation trace at 20x and more in bench/slo.py: its
# 1200 requests in under 30 s), so the order it starts in decides most of that run. Two-lane
# there keeps TTFTs but serves the requests worth most ESG last (0.91x FCFS's ESG at 30x);
# ESG density with a fast gate hedges both targets until the view can tell which is at risk.
FULL_INITIAL = "esg_fast"
# Steps of unprefilled prompt the local controller lets the engine hold (see slo.py).
GATE_STEPS = 2
RULES = SERVING_RULES
# A replay has no queue cap: memory at the brink is the only bypass trigger.
GUARDS = replace(SERVING_GUARD, bypass_queue_len=1_000_000)
LONG_WINDOW_S = 20.0


@dataclass(frozen=True)
class SloStack:
    name: str
    initial: str = "fcfs"
    selector: str | None = None  # "rules" | "bandit" | "llm"
    pool: tuple[str, ...] = POOL
    fence: bool = False
    adaptive: bool = False
    learn_lengths: bool = True
    meta_interval_s: float = 20.0
    lanes: str = "two_lane"  # what the rule map picks for HOL blocking and overload


_FULL = SloStack("full", FULL_INITIAL, "rules", fence=True, adaptive=True, lanes=FULL_LANES)
STACKS: Mapping[str, SloStack] = {
    "meta-rules": SloStack("meta-rules", META_INITIAL, "rules"),
    "meta-bandit": SloStack("meta-bandit", META_INITIAL, "bandit"),
    "meta-llm": SloStack("meta-llm", META_INITIAL, "llm"),
    "full": _FULL,
    "full-no-two-lane": replace(_FULL, name="full-no-two-lane", initial="sjf",
                                pool=tuple(p for p in POOL if not p.startswith("two_lane"))),
    "full-frozen-statera": replace(_FULL, name="full-frozen-statera", adaptive=False),
    "full-no-meta": replace(_FULL, name="full-no-meta", initial="fcfs", selector=None),
    "full-rule-prediction": replace(_FULL, name="full-rule-prediction", learn_lengths=False),
    "full-fifo-late": replace(_FULL, name="full-fifo-late", initial=META_INITIAL,
                              lanes=META_INITIAL),
    "full-lanes-first": replace(_FULL, name="full-lanes-first", initial=FULL_LANES),
}


ORDERINGS = (*POOL, *STACKS)


def slo_stack(name: str) -> SloStack:
    if name in STACKS:
        return STACKS[name]
    if name in POOL:
        return SloStack(name, initial=name)
    raise KeyError(f"unknown ordering {name!r}; known: {', '.join(ORDERINGS)}")
