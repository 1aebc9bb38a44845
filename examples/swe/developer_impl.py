"""A developer: writes code for one subtask, using the docs and the last test log."""

from __future__ import annotations

import agentd


class Developer:
    def implement(self, task: str, docs: str, attempt: int, feedback: str) -> str:
        hint = f" Fix: {feedback}" if feedback else ""
        body = agentd.llm(f"Implement '{task}'. Docs: {docs}.{hint}", max_tokens=12)
        return f"# {task} (attempt {attempt})\n# {body[:60]!r}\n"
