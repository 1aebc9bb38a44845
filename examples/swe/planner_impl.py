"""The planner: splits a feature request into subtasks. An ordinary class; its stub
(planner.py) is generated from planner.yaml by `agentctl stubgen planner.yaml`."""

from __future__ import annotations

import agentd

AREAS = ("data model", "API endpoint", "user interface", "migration", "documentation")


class Planner:
    def plan(self, request: str, size: int) -> list[str]:
        # The LLM call is scheduled like any other; the split itself is deterministic so
        # that a simulated engine (whose text means nothing) gives a stable workflow.
        agentd.llm(f"Split into {size} subtasks: {request}", max_tokens=16)
        return [f"{request}: {AREAS[i % len(AREAS)]}" for i in range(size)]
