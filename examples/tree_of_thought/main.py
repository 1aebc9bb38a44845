"""Tree of thought with agentd.Context.fork: branch, score each branch, keep the best.

The problem is prefilled once; `fork(breadth)` gives each branch the same token ids, so
every branch's first generate finds the problem in the engine's prefix cache (the
`cached_tokens` of each node, in the result). Each branch proposes a next step (sampled,
its own seed), a fork of it asks the model to rate that step with a JSON-schema-constrained
score, and the `keep` best branches grow again, `depth` times. The answer is generated on
the best leaf.

On a daemon with the simulated engine or the real SmolLM2 worker (examples/router says
how to start either):

    agentctl submit examples/tree_of_thought --follow \\
        --args '{"problem": "Plan a three-day trip to Rome on a small budget."}'
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import agentd

SYSTEM = "You solve problems one short step at a time."
RATING = {"type": "object", "additionalProperties": False, "required": ["score"],
          "properties": {"score": {"type": "integer", "minimum": 1, "maximum": 10}}}


@dataclass
class Branch:
    ctx: agentd.Context
    steps: list[str]
    score: int = 0


def propose(branch: Branch, seed: int, nodes: list[dict[str, Any]]) -> Branch:
    ctx = branch.ctx.fork(1)[0].user("Give the next step, in one sentence.")
    out = ctx.generate(max_tokens=32, temperature=0.8, seed=seed)
    child = Branch(ctx, [*branch.steps, out.text.strip()])
    child.score = rate(child)
    nodes.append({"depth": len(child.steps), "step": child.steps[-1], "score": child.score,
                  "prompt_tokens": out.prompt_tokens, "cached_tokens": out.cached_tokens})
    return child


def rate(branch: Branch) -> int:
    """The model's 1-10 rating of the branch's last step, on a throwaway fork."""
    judge = branch.ctx.fork(1)[0].user("Rate the last step from 1 (useless) to 10 (ideal).")
    out = judge.generate(max_tokens=16, temperature=0, json_schema=RATING)
    judge.drop()
    return int(json.loads(out.text)["score"])


def main(problem: str, breadth: int = 3, keep: int = 2, depth: int = 2) -> dict[str, Any]:
    root = Branch(agentd.Context().system(SYSTEM).user(problem).fill(), [])
    frontier: list[Branch] = [root]
    nodes: list[dict[str, Any]] = []
    seed = 0
    for _ in range(depth):
        children = []
        for branch in frontier:
            for _ in range(breadth):
                seed += 1
                children.append(propose(branch, seed, nodes))
        frontier = sorted(children, key=lambda b: -b.score)[:keep]
    best = frontier[0]
    best.ctx.user("Now give the whole plan in two sentences.")
    answer = best.ctx.generate(max_tokens=64, temperature=0)
    return {"answer": answer.text, "best_steps": best.steps, "best_score": best.score,
            "nodes": nodes, "problem_tokens": len(root.ctx.token_ids)}
