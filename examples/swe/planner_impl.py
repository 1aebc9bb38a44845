"""The planner: asks the model to split a feature request into subtasks. An ordinary class;
its stub (planner.py) is generated from planner.yaml by `agentctl stubgen planner.yaml`.

A small model does not always answer with a numbered list of the size asked for (and the
simulated engine's text is filler), so a reply that does not parse falls back to a fixed
split by area; either way every subtask reads "<request>: <area>"."""

from __future__ import annotations

import re

import agentd

AREAS = ("data model", "API endpoint", "user interface", "migration", "documentation")
MAX_AREA_CHARS = 60
TOKENS_PER_ITEM = 10
SYSTEM = ("You split a software feature into subtasks. Reply with a numbered list only, one "
          "short line per subtask.")
# A worked example: asked without one, SmolLM2-135M replied "1. 2018-01-22 20:30:".
SHOT = ("Feature: user profile page. Subtasks: 3",
        "1. Profile database table\n2. Profile REST endpoint\n3. Profile page layout")
_ITEM = re.compile(r"^\s*(?:\d+[.)]|[-*])\s+(.+)$", re.M)


def parse_areas(reply: str, size: int) -> list[str] | None:
    """The first `size` distinct list items of a reply, or None when it has fewer."""
    areas: list[str] = []
    for item in _ITEM.findall(reply):
        area = " ".join(item.replace("*", " ").replace(":", " ").split())[:MAX_AREA_CHARS]
        if area and area.lower() not in (a.lower() for a in areas):
            areas.append(area)
    return areas[:size] if len(areas) >= size else None


class Planner:
    def plan(self, request: str, size: int) -> list[str]:
        reply = agentd.llm([{"role": "system", "content": SYSTEM},
                            {"role": "user", "content": SHOT[0]},
                            {"role": "assistant", "content": SHOT[1]},
                            {"role": "user", "content": f"Feature: {request}. Subtasks: {size}"}],
                           max_tokens=TOKENS_PER_ITEM * size, temperature=0)
        areas = parse_areas(reply, size) or [AREAS[i % len(AREAS)] for i in range(size)]
        return [f"{request}: {area}" for area in areas]
