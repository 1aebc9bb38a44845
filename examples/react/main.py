"""A ReAct agent on one agentd.Context: think, call a tool, read its result, eight times.

Each step asks the model for one JSON action, constrained by a JSON schema to a tool name
and its input, so even a 135M model's actions parse. The program, not the server, decides
the loop: `tool_calls` actions (eight by default), then the answer as a plain generate.
Each tool's result is appended as a turn, and the next step costs only the new tokens: the
context is token ids, so everything before is served from the engine's prefix cache
(`cached_tokens` per step, in the result).

Tools are local functions (a fact table and a calculator), called as agentd tools so
they show in the run's trace as futures; each call runs inside `ctx.idle()`, so the KV
layer sees the wait as a tool span of the program (run locally, pass a `program_id`).

On a daemon with the simulated engine (its JSON is valid against the schema, its words
filler) or the real SmolLM2 worker (see examples/router for starting either):

    agentctl submit examples/react --follow \
        --args '{"question": "How many people live in Paris and Rome together?"}'

Locally against a daemon: `cd examples/react && AGENTD_URL=http://127.0.0.1:8420
AGENTD_TOKEN=$(cat ~/.config/agentd/token) python -c "import main; print(main.main('...'))"`
"""

from __future__ import annotations

import ast
import json
import operator
from collections.abc import Callable
from typing import Any

import agentd

FACTS = {"paris": "Paris has 2.1 million inhabitants.",
         "rome": "Rome has 2.8 million inhabitants.",
         "berlin": "Berlin has 3.7 million inhabitants.",
         "madrid": "Madrid has 3.3 million inhabitants."}
TOOLS = ("lookup", "calculate")
SYSTEM = ("You answer questions with tools. Each turn, reply with one JSON object: "
          '{"thought": why, "action": "lookup" or "calculate", "input": its argument}. '
          "lookup(name) returns a fact about a city; calculate(expression) does arithmetic.")
_OPS: dict[type, Callable[..., float]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
    ast.Div: operator.truediv, ast.USub: operator.neg}


@agentd.tool
def lookup(name: str) -> str:
    return FACTS.get(name.strip().lower(), f"No fact about {name!r}.")


@agentd.tool
def calculate(expression: str) -> str:
    try:
        return str(_evaluate(ast.parse(expression, mode="eval").body))
    except (SyntaxError, ValueError, ZeroDivisionError) as exc:
        return f"cannot calculate {expression!r}: {exc}"


def _evaluate(node: ast.expr) -> float:
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
        return float(node.value)
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return float(_OPS[type(node.op)](_evaluate(node.left), _evaluate(node.right)))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
        return float(_OPS[type(node.op)](_evaluate(node.operand)))
    raise ValueError("only numbers and + - * /")


def action_schema(actions: tuple[str, ...]) -> dict[str, Any]:
    return {"type": "object", "additionalProperties": False,
            "required": ["thought", "action", "input"],
            "properties": {"thought": {"type": "string", "pattern": r"^[A-Za-z ,.']{1,60}$"},
                           "action": {"enum": list(actions)},
                           "input": {"type": "string", "pattern": r"^[A-Za-z0-9 +*/().-]{1,30}$"}}}


def parse_action(text: str) -> dict[str, str] | None:
    """The action the JSON names; None when the output was cut before the JSON closed."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return None
    return {"action": str(value["action"]), "input": str(value["input"])}


def run_tool(action: str, argument: str) -> str:
    result = lookup(argument) if action == "lookup" else calculate(argument)
    return str(agentd.resolve(result))


def main(question: str, tool_calls: int = 8, program_id: str | None = None) -> dict[str, Any]:
    ctx = agentd.Context(program_id=program_id).system(SYSTEM).user(question)
    steps: list[dict[str, Any]] = []
    for _ in range(tool_calls):
        # Short strings of plain characters: the whole object fits max_tokens.
        out = ctx.generate(max_tokens=160, temperature=0, json_schema=action_schema(TOOLS))
        act = parse_action(out.text)
        if act is None:  # cut short at max_tokens: say so, as to any agent that misspoke
            act = {"action": "none", "input": ""}
            observation = "Your action was cut short; reply with one short JSON object."
        else:
            with ctx.idle():  # the tool's wait: the KV layer may pause this program
                observation = run_tool(act["action"], act["input"])
        ctx.user(f"Observation: {observation}")
        steps.append({"action": act["action"], "input": act["input"],
                      "observation": observation, "prompt_tokens": out.prompt_tokens,
                      "cached_tokens": out.cached_tokens})
    ctx.user("Now answer the question in one sentence.")
    answer = ctx.generate(max_tokens=48, temperature=0)
    return {"answer": answer.text, "steps": steps, "context_tokens": len(ctx.token_ids)}
