"""The Responses API through the official openai client, against a real daemon on a sim
worker: text and function calls, whole and streamed, chains by previous_response_id (one
program), the store (GET, DELETE, store=false), and 400s naming what is refused."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import jsonschema
import openai
import pytest
from openai.types.responses import Response, ResponseFunctionToolCall

from tests.daemon_process import DaemonProcess

MODEL = "sim-llama3-8b"
WEATHER: Any = {"type": "function", "name": "get_weather", "description": "Weather in a city",
                "parameters": {"type": "object", "properties": {
                    "city": {"type": "string", "minLength": 2},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                    "required": ["city", "unit"], "additionalProperties": False},
                "strict": True}


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    d = DaemonProcess(data_dir=tmp_path_factory.mktemp("responses") / "data").start()
    yield d
    d.stop()


@pytest.fixture(scope="module")
def client(daemon: DaemonProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{daemon.url}/v1", api_key=daemon.token, max_retries=0)


def program_of(response: Response) -> str:
    return str((response.model_extra or {})["program_id"])


def test_a_text_response_is_stored_and_retrieved(client: openai.OpenAI) -> None:
    response = client.responses.create(model=MODEL, input="Plan the fix.",
                                       instructions="You are terse.", max_output_tokens=6)
    assert response.status == "incomplete"  # it ran to max_output_tokens
    assert response.incomplete_details is not None
    assert response.incomplete_details.reason == "max_output_tokens"
    assert len(response.output_text.split()) == 6
    assert response.usage is not None and response.usage.output_tokens == 6
    assert response.usage.input_tokens > 0
    again = client.responses.retrieve(response.id)
    assert again.model_dump() == response.model_dump()


def test_a_chain_is_one_program_and_carries_the_conversation(
        client: openai.OpenAI, daemon: DaemonProcess) -> None:
    first = client.responses.create(model=MODEL, input="Read the failing test.",
                                    instructions="Answer briefly. " * 20, max_output_tokens=5)
    second = client.responses.create(model=MODEL, input="Now fix it.", max_output_tokens=5,
                                     previous_response_id=first.id)
    assert program_of(second) == program_of(first)
    program = daemon.get(f"/v1/programs/{program_of(first)}").json()
    assert program["steps"] == 2 and program["status"] == "ACTING", program
    # The second prompt is the first's input and reply plus the new input, without the
    # first's instructions (they do not carry over).
    assert first.usage is not None and second.usage is not None
    [first_req, second_req] = program["requests"]
    assert second.usage.input_tokens == second_req["prompt_tokens"]
    assert second.usage.input_tokens < first.usage.input_tokens
    third = client.responses.create(model=MODEL, input="And test it.", max_output_tokens=5,
                                    previous_response_id=second.id,
                                    instructions="Answer briefly. " * 20)
    assert program_of(third) == program_of(first)
    assert third.usage is not None
    assert third.usage.input_tokens > first.usage.input_tokens + second.usage.output_tokens
    assert first_req["prompt_tokens"] == first.usage.input_tokens


def test_streamed_events_spell_the_response(client: openai.OpenAI) -> None:
    events = list(client.responses.create(model=MODEL, input="Stream a plan.",
                                          max_output_tokens=7, stream=True))
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress",
                         "response.output_item.added", "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done",
                          "response.output_item.done", "response.completed"]
    assert kinds.count("response.output_text.delta") == 7
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    completed = events[-1]
    assert completed.type == "response.completed"
    assert completed.response.output_text == deltas
    assert client.responses.retrieve(completed.response.id).output_text == deltas


def test_a_function_call_and_its_output_continue_the_chain(client: openai.OpenAI) -> None:
    asked = client.responses.create(model=MODEL, input="Weather in Paris?", tools=[WEATHER],
                                    tool_choice="required", max_output_tokens=64)
    [call] = [item for item in asked.output if isinstance(item, ResponseFunctionToolCall)]
    assert call.name == "get_weather" and call.call_id
    jsonschema.validate(json.loads(call.arguments), WEATHER["parameters"])
    answered = client.responses.create(
        model=MODEL, previous_response_id=asked.id, tools=[WEATHER], tool_choice="none",
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "18 C"}],
        max_output_tokens=8)
    assert program_of(answered) == program_of(asked)
    assert answered.output_text and not [
        i for i in answered.output if isinstance(i, ResponseFunctionToolCall)]


def test_a_stateless_client_sends_the_items_back(client: openai.OpenAI) -> None:
    """store=false: the client keeps the history (the call item and its output), and
    lineage inference still finds the program."""
    asked = client.responses.create(model=MODEL, input="Weather in Oslo?", tools=[WEATHER],
                                    tool_choice="required", store=False, max_output_tokens=64)
    [call] = [item for item in asked.output if isinstance(item, ResponseFunctionToolCall)]
    history: list[Any] = [{"role": "user", "content": "Weather in Oslo?"},
                          call.model_dump(exclude_none=True),
                          {"type": "function_call_output", "call_id": call.call_id,
                           "output": "-3 C"}]
    answered = client.responses.create(model=MODEL, input=history, tools=[WEATHER],
                                       store=False, max_output_tokens=8)
    assert program_of(answered) == program_of(asked)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(asked.id)


def test_streamed_function_call_events(client: openai.OpenAI) -> None:
    events = list(client.responses.create(model=MODEL, input="Weather in Rome?",
                                          tools=[WEATHER], tool_choice="required",
                                          max_output_tokens=64, stream=True))
    kinds = [e.type for e in events]
    assert "response.function_call_arguments.delta" in kinds
    done = next(e for e in events if e.type == "response.function_call_arguments.done")
    deltas = "".join(e.delta for e in events
                     if e.type == "response.function_call_arguments.delta")
    assert done.arguments == deltas
    jsonschema.validate(json.loads(done.arguments), WEATHER["parameters"])
    completed = events[-1]
    assert completed.type == "response.completed"
    [call] = completed.response.output
    assert isinstance(call, ResponseFunctionToolCall) and call.arguments == deltas


def test_delete_and_store_false(client: openai.OpenAI, daemon: DaemonProcess) -> None:
    kept = client.responses.create(model=MODEL, input="Keep me.", max_output_tokens=2)
    client.responses.delete(kept.id)
    for method in ("GET", "DELETE"):
        r = httpx.request(method, f"{daemon.url}/v1/responses/{kept.id}",
                          headers=daemon.auth_headers())
        assert r.status_code == 404 and r.json()["error"]["param"] == "response_id", r.text
    r = daemon.post("/v1/responses", json={"model": MODEL, "input": "go on",
                                           "previous_response_id": kept.id})
    assert r.status_code == 404, r.text
    assert r.json()["error"]["param"] == "previous_response_id"
    unkept = client.responses.create(model=MODEL, input="Forget me.", store=False,
                                     max_output_tokens=2)
    assert daemon.get(f"/v1/responses/{unkept.id}").status_code == 404


@pytest.mark.parametrize(("body", "param"), [
    ({"input": [{"type": "reasoning", "summary": []}]}, "input[0].type"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
     "input[0].content[0].type"),
    ({"input": [{"role": "robot", "content": "hi"}]}, "input[0].role"),
    ({"input": "hi", "background": True}, "background"),
    ({"input": "hi", "truncation": "auto"}, "truncation"),
    ({"input": "hi", "frobnicate": 1}, "frobnicate"),
    ({"input": "hi", "tools": [{"type": "web_search"}]}, "tools[0].type"),
    ({"input": "hi", "tool_choice": "required"}, "tool_choice"),
    ({"input": "hi", "text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format"),
])
def test_what_is_refused_is_a_400_naming_it(daemon: DaemonProcess, body: dict[str, Any],
                                            param: str) -> None:
    r = daemon.post("/v1/responses", json={"model": MODEL, **body})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.text
