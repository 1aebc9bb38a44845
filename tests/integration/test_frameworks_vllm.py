"""Tool calling on the real engine: agent frameworks and the openai client through agentd
to SmolLM2-135M under vLLM (CPU), served as README's "Use agentd from your framework"
says: vllm_chat_template = "chatml-tools", vllm_tool_call_parser = "hermes".

The small model's answers are not the point, the protocol is: a forced first call comes
back parsed and valid (structured output), the framework runs the tool, sends its result
back, and the loop ends. Skipped when vLLM or the model is missing, unless
AGENTD_REQUIRE_VLLM=1. Short outputs keep it to a few minutes on two CPU cores.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import jsonschema
import openai
import pytest

from tests.daemon_process import DaemonProcess
from tests.framework_loops import langgraph_loop, openai_agents_loop
from tests.integration.test_vllm_daemon import KV_BYTES, vllm_daemon

pytestmark = pytest.mark.vllm
WEATHER: Any = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}
ASK: Any = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    d = vllm_daemon(tmp_path_factory.mktemp("vllm-tools") / "data", KV_BYTES, 1024,
                    env={"AGENTD_VLLM_CHAT_TEMPLATE": "chatml-tools",
                         "AGENTD_VLLM_TOOL_CALL_PARSER": "hermes"})
    yield d
    d.stop()


@pytest.fixture(scope="module")
def model(daemon: DaemonProcess) -> str:
    return str(daemon.get("/v1/models").json()["data"][0]["id"])


@pytest.fixture(scope="module")
def client(daemon: DaemonProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{daemon.url}/v1", api_key=daemon.token, max_retries=0,
                         timeout=300)


def test_required_choice_gives_a_valid_call(client: openai.OpenAI, model: str) -> None:
    resp = client.chat.completions.create(model=model, messages=ASK,
                                          tools=[WEATHER], tool_choice="required",
                                          max_tokens=48, temperature=0)
    choice = resp.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    [call] = choice.message.tool_calls or []
    assert call.function.name == "get_weather"  # type: ignore[union-attr]
    jsonschema.validate(json.loads(call.function.arguments),  # type: ignore[union-attr]
                        WEATHER["function"]["parameters"])


def test_openai_client_streams_the_call(client: openai.OpenAI, model: str) -> None:
    stream = client.chat.completions.create(
        model=model, messages=ASK, tools=[WEATHER], max_tokens=48,
        temperature=0, stream=True, tool_choice={"type": "function",
                                                 "function": {"name": "get_weather"}})
    pieces: list[Any] = []
    finishes = []
    for chunk in stream:
        pieces += chunk.choices[0].delta.tool_calls or [] if chunk.choices else []
        finishes += [c.finish_reason for c in chunk.choices if c.finish_reason]
    assert finishes == ["stop"]  # a named choice
    assert len(pieces) > 2  # the arguments arrive in pieces
    assert pieces[0].id and pieces[0].function.name == "get_weather"
    assert {p.index for p in pieces} == {0} and all(p.id is None for p in pieces[1:])
    arguments = "".join(p.function.arguments or "" for p in pieces)
    jsonschema.validate(json.loads(arguments), WEATHER["function"]["parameters"])


def test_history_with_calls_and_results_reaches_the_prompt(client: openai.OpenAI,
                                                           model: str) -> None:
    call: Any = {"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    short = client.chat.completions.create(model=model, messages=ASK,
                                           max_tokens=1)
    long = client.chat.completions.create(
        model=model, max_tokens=1, messages=[
            *ASK, {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_1", "content": "It is sunny in Paris."}])
    assert short.usage is not None and long.usage is not None
    # The call and the result with their markup: well over the 20 tokens of their text.
    assert long.usage.prompt_tokens > short.usage.prompt_tokens + 30


def test_openai_agents_sdk(daemon: DaemonProcess, model: str) -> None:
    loop = openai_agents_loop(daemon, model, first_choice="required", max_tokens=40)
    assert loop.cities and all(loop.cities)
    first, second = loop.requests[:2]
    assert second.input_tokens > first.input_tokens + first.output_tokens


def test_langgraph(daemon: DaemonProcess, model: str) -> None:
    loop = langgraph_loop(daemon, model, first_choice="required", max_tokens=40)
    assert loop.cities and all(loop.cities)
    kinds = [m.type for m in loop.requests]
    assert kinds[:3] == ["human", "ai", "tool"] and kinds[-1] == "ai"
    assert not loop.requests[-1].tool_calls
