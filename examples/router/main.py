"""NALAR's router workflow: classify a request, then answer it on the chat or coding branch.

Run locally:   python -c "import main; print(main.main('write a sort in python'))"
(with AGENTD_URL/AGENTD_TOKEN set for agentd.llm), or submit it:
    agentctl submit examples/router --entry main:main --args '{"request": "..."}' --follow
"""

from __future__ import annotations

import agentd

CODE_WORDS = ("code", "python", "function", "bug", "compile", "sort", "script")


@agentd.agent(stateful=True)
class Classifier:
    def classify(self, request: str) -> str:
        # The LLM call is scheduled like any other; a keyword rule makes the branch
        # deterministic on simulated engines, whose text means nothing.
        agentd.llm([{"role": "system", "content": "Answer 'chat' or 'coding'."},
                    {"role": "user", "content": request}], max_tokens=4)
        return "coding" if any(w in request.lower() for w in CODE_WORDS) else "chat"


@agentd.agent(max_instances=2)
class ChatAgent:
    def answer(self, request: str) -> str:
        return agentd.llm([{"role": "user", "content": request}], max_tokens=16)


@agentd.agent(max_instances=2)
class CodingAgent:
    def solve(self, request: str) -> str:
        plan = agentd.llm([{"role": "user", "content": f"Plan: {request}"}], max_tokens=8)
        return agentd.llm([{"role": "user", "content": f"Write code for: {plan}"}],
                          max_tokens=16)


def main(request: str) -> dict[str, str]:
    history = agentd.ManagedList("router_history")
    label = Classifier().classify(request)  # a Future
    # using the value (==) waits for it
    answer = CodingAgent().solve(request) if label == "coding" else ChatAgent().answer(request)
    history.append({"request": request, "branch": str(label)})
    return {"branch": str(label), "answer": str(answer), "turns": str(len(history))}
