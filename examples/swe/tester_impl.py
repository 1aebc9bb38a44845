"""A tester: runs the (simulated) test suite for one subtask's code.

Which attempts fail is a function of the subtask's area, so a run is repeatable: the API
endpoint and the migration pass at once, the data model and the documentation need a
second attempt, the user interface a third (the retry loop). Areas the model planned fail
likewise by the length of their name. The model's review is reported, not judged."""

from __future__ import annotations

import re

import agentd

# The developer's header line; anchored so that model text quoted below it cannot match.
ATTEMPT = re.compile(r"^# .* \(attempt (\d+)\)$", re.M)


def failures_before_pass(task: str) -> int:
    return len(task.split(": ")[-1]) % 3


class Tester:
    def test(self, task: str, code: str) -> dict[str, object]:
        review = agentd.llm(f"Review the tests for '{task}'", max_tokens=6)
        match = ATTEMPT.search(code)
        attempt = int(match.group(1)) if match else 0
        passed = attempt >= failures_before_pass(task)
        log = "all tests pass" if passed else f"test_{attempt} failed for {task}"
        return {"task": task, "passed": passed, "log": log, "code": code,
                "review": " ".join(review.split())}
