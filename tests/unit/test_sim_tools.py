"""The sim's structured answers: JSON values valid against their schemas, tool calls in
the engine's stream and finish, simulated logprobs."""

from __future__ import annotations

import json
import math
import random
from typing import Any

import jsonschema
import pytest

from daemon.engines.sim import tokenizer
from daemon.engines.sim.engine import SimEngine, token_logprob
from daemon.engines.sim.tools import schema_instance, scripted_reply
from daemon.workers.protocol import ChatMessage, Finish, SamplingParams, Submit, TokenDelta, Tools

SCHEMAS: list[dict[str, Any]] = [
    {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    {"type": "object", "properties": {
        "n": {"type": "integer", "minimum": 3, "maximum": 9, "multipleOf": 3},
        "x": {"type": "number", "exclusiveMinimum": 0.5, "exclusiveMaximum": 0.6},
        "flag": {"type": "boolean"}, "nothing": {"type": "null"},
        "tag": {"type": "string", "minLength": 12, "maxLength": 14},
        "when": {"type": "string", "format": "date-time"},
        "unit": {"enum": ["c", "f"]}, "version": {"const": 2}},
     "required": ["n", "x", "flag", "nothing", "tag", "when", "unit", "version"],
     "additionalProperties": False},
    {"type": "array", "items": {"type": "integer", "minimum": -2, "maximum": -1},
     "minItems": 3, "maxItems": 3},
    {"type": "array", "prefixItems": [{"type": "string"}, {"type": "integer"}], "minItems": 2},
    {"anyOf": [{"type": "string", "maxLength": 3}, {"type": "integer"}]},
    {"type": ["null", "integer"], "minimum": 10},
    {"allOf": [{"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]},
               {"properties": {"b": {"type": "integer"}}, "required": ["b"]}]},
    {"$defs": {"Point": {"type": "object", "properties": {
        "x": {"type": "number"}, "y": {"type": "number"}}, "required": ["x", "y"],
        "additionalProperties": False}},
     "type": "object",
     "properties": {"points": {"type": "array", "items": {"$ref": "#/$defs/Point"},
                               "minItems": 1}},
     "required": ["points"]},
    # Recursive: a tree of nodes; the instance must end.
    {"$defs": {"Node": {"type": "object", "properties": {
        "name": {"type": "string"},
        "children": {"type": "array", "items": {"$ref": "#/$defs/Node"}}},
        "required": ["name"]}}, "$ref": "#/$defs/Node"},
    # What pydantic (the OpenAI Agents SDK, LangChain) makes of a function's signature.
    {"properties": {"city": {"title": "City", "type": "string"},
                    "days": {"anyOf": [{"type": "integer"}, {"type": "null"}], "default": None,
                             "title": "Days"}},
     "required": ["city", "days"], "title": "get_weather_args", "type": "object",
     "additionalProperties": False},
    {},
]


@pytest.mark.parametrize("schema", SCHEMAS)
def test_instances_are_valid(schema: dict[str, Any]) -> None:
    for seed in range(20):
        jsonschema.validate(schema_instance(schema, random.Random(seed)), schema)


def weather_tools(choice: str, function: str | None = None) -> Tools:
    return Tools(functions=json.dumps([{"type": "function", "function": {
        "name": "get_weather", "parameters": SCHEMAS[0]}}]), choice=choice, function=function)


def submit(tools: Tools | None, messages: list[ChatMessage], max_tokens: int = 64,
           **sampling: Any) -> Submit:
    return Submit(request_id="r1", program_id="p", messages=messages, tools=tools,
                  sampling=SamplingParams(max_tokens=max_tokens, **sampling))


ASK = [ChatMessage("user", "weather in Paris?")]


def test_auto_calls_after_a_user_turn_and_answers_a_tool_result() -> None:
    script = scripted_reply(submit(weather_tools("auto"), ASK), seed=1)
    assert script is not None and [c.name for c in script.calls] == ["get_weather"]
    call = script.calls[0]
    assert "".join(script.pieces) == tokenizer.call_text(call.name, call.arguments)
    answered = [*ASK, ChatMessage("assistant", "", tool_calls=script.calls),
                ChatMessage("tool", "sunny", tool_call_id=call.id)]
    assert scripted_reply(submit(weather_tools("auto"), answered), seed=1) is None
    assert scripted_reply(submit(weather_tools("required"), answered), seed=1) is not None
    assert scripted_reply(submit(weather_tools("none"), ASK), seed=1) is None


def test_a_call_sent_back_tokenizes_as_generated() -> None:
    """The history renders a call as the sim wrote it: its tokens are the prefix's."""
    script = scripted_reply(submit(weather_tools("required"), ASK), seed=3)
    assert script is not None
    generated = tokenizer.encode("".join(script.pieces))
    turn = tokenizer.encode(tokenizer.render_chat(
        [*ASK, ChatMessage("assistant", "", tool_calls=script.calls)], weather_tools("auto")))
    prompt = tokenizer.encode(tokenizer.render_chat(ASK, weather_tools("auto")))
    assert turn[len(prompt):len(prompt) + len(generated)] == generated


async def run(engine: SimEngine, sub: Submit) -> tuple[list[TokenDelta], Finish]:
    deltas: list[TokenDelta] = []
    async for out in engine.generate(sub):
        if isinstance(out, Finish):
            return deltas, out
        deltas.append(out)
    raise AssertionError("no finish")


async def test_the_engine_streams_a_call_and_finishes_with_it() -> None:
    engine = SimEngine(time_scale=0.0)
    await engine.start()
    try:
        deltas, finish = await run(engine, submit(weather_tools("function", "get_weather"), ASK))
        assert finish.reason == "stop" and finish.reply is not None
        [call] = finish.reply.tool_calls
        assert finish.reply.content is None
        assert all(d.message is not None and not d.message.content for d in deltas)
        [piece] = [p for d in deltas if d.message for p in d.message.tool_calls]
        assert deltas[-1].message is not None and deltas[-1].message.tool_calls == [piece]
        assert (piece.id, piece.name, piece.arguments) == (call.id, call.name, call.arguments)
        assert finish.output_tokens == len(deltas)
        cut_deltas, cut = await run(engine, submit(weather_tools("required"), ASK, max_tokens=4))
        assert cut.reason == "length" and cut.reply is not None and not cut.reply.tool_calls
        assert cut.reply.content == "".join(d.text for d in cut_deltas)
    finally:
        await engine.shutdown()


async def test_the_engine_writes_json_for_a_schema() -> None:
    engine = SimEngine(time_scale=0.0)
    await engine.start()
    try:
        schema = SCHEMAS[1]
        deltas, finish = await run(engine, submit(None, ASK, max_tokens=200,
                                                  json_schema=json.dumps(schema)))
        assert finish.reason == "stop" and finish.reply is None
        jsonschema.validate(json.loads("".join(d.text for d in deltas)), schema)
    finally:
        await engine.shutdown()


def test_simulated_logprobs() -> None:
    lp = token_logprob(seed=5, index=2, text=" sim2", alternatives=4)
    assert lp == token_logprob(seed=5, index=2, text=" sim2", alternatives=4)
    assert lp.top[0].token == lp.token == " sim2" and lp.top[0].logprob == lp.logprob
    chances = [math.exp(t.logprob) for t in lp.top]
    assert len(chances) == 4 and chances == sorted(chances, reverse=True)
    assert sum(chances) <= 1.0
    assert token_logprob(seed=5, index=2, text=" sim2", alternatives=0).top == []
