"""Software engineering (NALAR Fig. 1 and 4): planner -> developers -> testers -> retries.

The planner splits the request (the model's numbered list, or a fixed split by area when
the reply does not parse); each subtask goes to a developer (with the docs tool's
snippet) and its code to a tester, all in parallel; a subtask whose tests fail goes back
to a developer with the test log, until it passes or the retry budget is spent. The
agents are plain classes (*_impl.py) behind stubs generated from their YAML:

    agentctl stubgen examples/swe/planner.yaml     # -> planner.py; likewise developer, tester

Run it on a daemon with the simulated engine (`make run ENGINE=sim` does the same):

    agentd start --engine sim
    agentctl submit examples/swe --args '{"request": "OAuth login"}' --follow

or on the real SmolLM2 worker (vLLM CPU): `make model` installs vLLM and converts the
model into ~/.cache/agentd/models/SmolLM2-135M-Instruct (`make run` does both steps):

    agentd start --engine vllm --model ~/.cache/agentd/models/SmolLM2-135M-Instruct
    agentctl submit examples/swe --args '{"request": "OAuth login", "size": 2}' --follow

agentctl reads the daemon's address and token from --url/--token, $AGENTD_URL/$AGENTD_TOKEN,
or http://127.0.0.1:8420 and ~/.config/agentd/token.
"""

from __future__ import annotations

from typing import Any

import developer
import planner
import tester

import agentd


@agentd.tool
def docs(task: str) -> str:
    """A stand-in for the documentation index: a deterministic snippet per subtask."""
    return f"see docs/{task.split(': ')[-1].replace(' ', '_')}.md"


def main(request: str, size: int = 3, max_retries: int = 8,
         timeout_s: float = 120.0) -> dict[str, Any]:
    subtasks = planner.plan(request, size)
    n = len(subtasks)  # using the value waits for the planner
    attempts = [0] * n
    reports = [tester.test(t, developer.implement(t, docs(t))) for t in subtasks]
    code: list[str | None] = [None] * n
    retries = 0
    while None in code:
        pending = [reports[i] for i in range(n) if code[i] is None]
        _, still = agentd.wait(pending, timeout=timeout_s, return_when=agentd.FIRST)
        if len(still) == len(pending):
            raise TimeoutError(f"no test report within {timeout_s}s")
        for i in range(n):
            if code[i] is not None or not agentd.as_future(reports[i]).available():
                continue
            report = reports[i]
            if report["passed"]:
                code[i] = str(report["code"])
                continue
            retries += 1
            if retries > max_retries:
                raise RuntimeError(f"gave up on {request!r} after {max_retries} retries")
            attempts[i] += 1
            retry = developer.implement(subtasks[i], docs(subtasks[i]), attempts[i],
                                        str(report["log"]))
            reports[i] = tester.test(subtasks[i], retry)
    history = agentd.ManagedList("swe_history")
    history.append({"request": request, "retries": retries})
    return {"request": request, "subtasks": n, "plan": list(subtasks), "retries": retries,
            "attempts": attempts, "code": "".join(c for c in code if c),
            "requests_in_session": len(history)}
