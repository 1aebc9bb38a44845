"""NALAR's router workflow: classify a request, then answer it on the chat or coding branch.

The classifier asks the model for a one-word label, showing it two worked examples. A
small model (or the simulated engine, whose text is filler) does not always answer with
one, so the label is parsed from the reply, asked for once more, and otherwise taken from
a keyword rule; `decided_by` in the result says which ("llm" or "rule").

Run it on a daemon with the simulated engine (`make run ENGINE=sim` does the same):

    agentd start --engine sim
    agentctl submit examples/router --args '{"request": "fix my python function"}' --follow

or on the real SmolLM2 worker (vLLM CPU): `make model` installs vLLM and converts the
model into ~/.cache/agentd/models/SmolLM2-135M-Instruct (`make run` does both steps):

    agentd start --engine vllm --model ~/.cache/agentd/models/SmolLM2-135M-Instruct
    agentctl submit examples/router --args '{"request": "how are you today?"}' --follow

agentctl reads the daemon's address and token from --url/--token, $AGENTD_URL/$AGENTD_TOKEN,
or their defaults (http://127.0.0.1:8420, ~/.config/agentd/token). To develop it locally,
without a sandbox, against either daemon's OpenAI endpoint:

    cd examples/router && AGENTD_URL=http://127.0.0.1:8420 \
        AGENTD_TOKEN=$(cat ~/.config/agentd/token) \
        python -c "import main; print(main.main('write a sort in python'))"
"""

from __future__ import annotations

import re

import agentd

CODE_WORDS = ("code", "python", "function", "bug", "compile", "sort", "script")
INSTRUCTION = ("Classify the user's request. Answer with exactly one word: 'coding' if it "
               "asks for programming help, 'chat' otherwise.")
# Worked examples show a small model the answer format instead of only describing it.
SHOTS = [("write a python function that reverses a list", "coding"),
         ("what a lovely morning, how are you?", "chat")]
CORRECTION = "Answer with one word: chat or coding."
_LABEL_WORD = re.compile(r"\b(chat|coding|code)\b")


def parse_label(reply: str) -> str | None:
    """The label a reply names, or None when it names none or both."""
    found = {"coding" if w == "code" else w for w in _LABEL_WORD.findall(reply.lower())}
    return found.pop() if len(found) == 1 else None


def keyword_label(request: str) -> str:
    return "coding" if any(w in request.lower() for w in CODE_WORDS) else "chat"


@agentd.agent(stateful=True)
class Classifier:
    def classify(self, request: str) -> dict[str, str]:
        messages = [{"role": "system", "content": INSTRUCTION},
                    *({"role": role, "content": text} for q, a in SHOTS
                      for role, text in (("user", q), ("assistant", a))),
                    {"role": "user", "content": request}]
        for _ in range(2):  # the retry points the model at its unusable answer
            reply = agentd.llm(messages, max_tokens=4, temperature=0)
            label = parse_label(reply)
            if label is not None:
                return {"label": label, "decided_by": "llm"}
            messages += [{"role": "assistant", "content": reply},
                         {"role": "user", "content": CORRECTION}]
        return {"label": keyword_label(request), "decided_by": "rule"}


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
    decision = Classifier().classify(request)  # a Future
    label = decision["label"]  # using the value waits for it
    answer = CodingAgent().solve(request) if label == "coding" else ChatAgent().answer(request)
    history.append({"request": request, "branch": label})
    return {"branch": label, "decided_by": decision["decided_by"], "answer": str(answer),
            "turns": str(len(history))}
