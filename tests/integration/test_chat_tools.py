"""OpenAI tool calling through agentd on a sim worker: tools and tool turns reach the prompt,
calls come back parsed (whole and streamed), and the requests agentd cannot serve are
refused with a 400 naming the field."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import jsonschema
import openai
import pytest

from daemon.engines.sim import tokenizer
from daemon.workers.protocol import ChatMessage, ToolCall, Tools, ToolSupport
from tests.daemon_process import DaemonProcess
from tests.waiting import wait_for
from tests.worker_socket import dealer, register_frame

MODEL = "sim-llama3-8b"
WEATHER: Any = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "minLength": 2},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7}},
        "required": ["city", "unit"], "additionalProperties": False}}}
TIME: Any = {"type": "function", "function": {
    "name": "get_time", "parameters": {"type": "object", "properties": {
        "zone": {"anyOf": [{"type": "string"}, {"type": "null"}]}}, "required": ["zone"]}}}
ASK: Any = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    d = DaemonProcess(data_dir=tmp_path_factory.mktemp("tools") / "data").start()
    yield d
    d.stop()


@pytest.fixture(scope="module")
def client(daemon: DaemonProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{daemon.url}/v1", api_key=daemon.token, max_retries=0)


def chat(d: DaemonProcess, **body: Any) -> Any:
    return d.post("/v1/chat/completions", json={"model": MODEL, "max_tokens": 64, **body})


def schema_of(name: str) -> dict[str, Any]:
    return next(t["function"]["parameters"] for t in (WEATHER, TIME)
                if t["function"]["name"] == name)


def assert_valid_calls(calls: list[Any]) -> None:
    assert calls
    for call in calls:
        jsonschema.validate(json.loads(call.function.arguments), schema_of(call.function.name))
        assert call.id and call.type == "function"


def test_required_choice_returns_a_valid_call(client: openai.OpenAI) -> None:
    resp = client.chat.completions.create(model=MODEL, messages=ASK,
                                          tools=[WEATHER, TIME], tool_choice="required",
                                          max_tokens=64)
    choice = resp.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    assert_valid_calls(choice.message.tool_calls or [])


def test_named_choice_calls_that_function_and_stops(client: openai.OpenAI) -> None:
    resp = client.chat.completions.create(
        model=MODEL, messages=ASK, tools=[WEATHER, TIME], max_tokens=64,
        tool_choice={"type": "function", "function": {"name": "get_time"}})
    choice = resp.choices[0]
    assert choice.finish_reason == "stop"  # as vLLM and OpenAI answer a named choice
    names = [c.function.name for c in choice.message.tool_calls or []]  # type: ignore[union-attr]
    assert names == ["get_time"]
    assert_valid_calls(choice.message.tool_calls or [])


def test_auto_calls_then_answers_the_tool_result(client: openai.OpenAI) -> None:
    first = client.chat.completions.create(model=MODEL, messages=ASK,
                                           tools=[WEATHER], max_tokens=64)
    [call] = first.choices[0].message.tool_calls or []
    history = [*ASK, first.choices[0].message.model_dump(exclude_none=True),
               {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21 C"}]
    second = client.chat.completions.create(model=MODEL, messages=history,
                                            tools=[WEATHER], max_tokens=5)
    assert second.choices[0].message.tool_calls is None
    assert second.choices[0].message.content and second.choices[0].finish_reason == "length"


def test_tools_calls_and_results_are_in_the_prompt(daemon: DaemonProcess) -> None:
    """usage.prompt_tokens is exactly the sim template's rendering with the tool specs, the
    assistant's call and the tool's result (the old gateway dropped calls and tools)."""
    arguments = '{"city": "Paris", "unit": "celsius"}'
    call = {"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": arguments}}
    messages = [*ASK, {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    resp = chat(daemon, messages=messages, tools=[WEATHER], max_tokens=2)
    assert resp.status_code == 200, resp.text
    expected = tokenizer.render_chat(
        [ChatMessage("user", ASK[0]["content"]),
         ChatMessage("assistant", "", tool_calls=[ToolCall(
             id="call_1", name="get_weather", arguments=arguments)]),
         ChatMessage("tool", "sunny", tool_call_id="call_1")],
        Tools(functions=json.dumps([WEATHER], separators=(",", ":"))))
    assert resp.json()["usage"]["prompt_tokens"] == tokenizer.count_tokens(expected)
    no_tools = chat(daemon, messages=messages[:1], max_tokens=2).json()["usage"]["prompt_tokens"]
    assert resp.json()["usage"]["prompt_tokens"] > no_tools + 20


def test_streamed_calls_in_openai_chunks(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(model=MODEL, messages=ASK,
                                            tools=[WEATHER], tool_choice="required",
                                            max_tokens=64, stream=True)
    pieces: dict[int, dict[str, str]] = {}
    finishes = []
    for chunk in stream:
        choice = chunk.choices[0]
        finishes += [choice.finish_reason] if choice.finish_reason else []
        assert not choice.delta.content  # a call's text is not content
        for piece in choice.delta.tool_calls or []:
            slot = pieces.setdefault(piece.index, {"id": "", "name": "", "arguments": ""})
            slot["id"] += piece.id or ""
            slot["name"] += (piece.function and piece.function.name) or ""
            slot["arguments"] += (piece.function and piece.function.arguments) or ""
    assert finishes == ["tool_calls"]
    [call] = pieces.values()
    assert call["name"] == "get_weather" and call["id"]
    jsonschema.validate(json.loads(call["arguments"]), schema_of("get_weather"))


def test_the_stream_helper_accumulates_the_call(client: openai.OpenAI) -> None:
    with client.chat.completions.stream(model=MODEL, messages=ASK,
                                        tools=[WEATHER], tool_choice="required",
                                        max_tokens=64) as stream:
        final = stream.get_final_completion()
    assert final.choices[0].finish_reason == "tool_calls"
    assert_valid_calls(final.choices[0].message.tool_calls or [])


def test_a_call_cut_by_max_tokens_is_no_call(client: openai.OpenAI) -> None:
    resp = client.chat.completions.create(model=MODEL, messages=ASK,
                                          tools=[WEATHER], tool_choice="required", max_tokens=3)
    choice = resp.choices[0]
    assert choice.finish_reason == "length" and choice.message.tool_calls is None
    assert choice.message.content and choice.message.content.startswith("<tool_call>")


def test_tool_choice_none_answers_in_text_with_tools_in_the_prompt(daemon: DaemonProcess
                                                                   ) -> None:
    with_tools = chat(daemon, messages=ASK, tools=[WEATHER], tool_choice="none", max_tokens=3)
    body = with_tools.json()
    assert body["choices"][0]["message"]["content"] == "sim0 sim1 sim2"
    assert "tool_calls" not in body["choices"][0]["message"]
    plain = chat(daemon, messages=ASK, max_tokens=3).json()
    assert body["usage"]["prompt_tokens"] > plain["usage"]["prompt_tokens"]


def test_sim_calls_are_deterministic_per_seed(daemon: DaemonProcess) -> None:
    def arguments(seed: int) -> str:
        body = chat(daemon, messages=ASK, tools=[WEATHER], tool_choice="required",
                    seed=seed).json()
        return body["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"]  # type: ignore[no-any-return]

    assert arguments(7) == arguments(7)
    assert len({arguments(s) for s in range(6)}) > 1


@pytest.mark.parametrize(("body", "param", "needle"), [
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "tool_choice", "not among the tools"),
    ({"tool_choice": "required"}, "tool_choice", "requires tools"),
    ({"tools": [WEATHER], "tool_choice": "sometimes"}, "tool_choice", "sometimes"),
    ({"tools": [{"type": "custom", "function": WEATHER["function"]}]}, "tools[0].type", "custom"),
    ({"tools": [{"type": "function", "function": {"name": "has space"}}]}, "tools[0].name",
     "has space"),
    ({"tools": [WEATHER, WEATHER]}, "tools", "twice"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}]},
     "tools[0].parameters", "object"),
    ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].tool_call_id", "tool_call_id"),
    ({"messages": [{"role": "user", "content": "x", "tool_call_id": "c"}]},
     "messages[0].tool_call_id", "tool_call_id"),
    ({"messages": [{"role": "user", "content": "x", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}]},
     "messages[0].tool_calls", "assistant"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "text": ""}]}]},
     "messages[0].content[0].type", "image_url"),
])
def test_bad_tool_requests_are_400_naming_the_field(daemon: DaemonProcess, body: dict[str, Any],
                                                     param: str, needle: str) -> None:
    resp = chat(daemon, **{"messages": ASK, **body})
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["param"] == param and needle in error["message"], error


def test_what_a_models_workers_cannot_do_is_refused(daemon: DaemonProcess) -> None:
    """A worker says at registration whether its template renders tools and which parser
    finds calls; a request its model's workers would drop or cannot parse is a 400."""
    plain = dealer(daemon, "w-plain-template")
    no_parser = dealer(daemon, "w-no-parser")
    try:
        plain.send(register_frame(daemon, "w-plain-template", model="plain-model",
                                  tools=ToolSupport()))
        no_parser.send(register_frame(daemon, "w-no-parser", model="forced-only",
                                      tools=ToolSupport(template=True)))
        wait_for(lambda: {"plain-model", "forced-only"} <= {
            m["id"] for m in daemon.get("/v1/models").json()["data"]}, 10, "both registered")
        history = [*ASK, {"role": "assistant", "content": "checking"},
                   {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]
        for body, param in (({"tools": [WEATHER], "tool_choice": "required"}, "tools"),
                            ({"messages": history}, "messages")):
            resp = daemon.post("/v1/chat/completions", json={
                "model": "plain-model", "messages": ASK, **body})
            assert resp.status_code == 400, resp.text
            assert resp.json()["error"]["param"] == param
            assert "does not render tools" in resp.json()["error"]["message"]
        resp = daemon.post("/v1/chat/completions", json={
            "model": "forced-only", "messages": ASK, "tools": [WEATHER]})
        assert resp.status_code == 400, resp.text
        assert resp.json()["error"]["param"] == "tool_choice"
        assert "vllm_tool_call_parser" in resp.json()["error"]["message"]
    finally:
        plain.close()
        no_parser.close()
