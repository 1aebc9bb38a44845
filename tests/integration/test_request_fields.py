"""No request field is silently ignored: what agentd does not read is a 400 naming it;
what OpenAI clients send by default passes; logprobs, response_format, penalties, user
and metadata are honoured (sim daemon)."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from typing import Any

import jsonschema
import openai
import pytest

from tests.daemon_process import DaemonProcess

MODEL = "sim-llama3-8b"
ASK: Any = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    d = DaemonProcess(data_dir=tmp_path_factory.mktemp("fields") / "data").start()
    yield d
    d.stop()


@pytest.fixture(scope="module")
def client(daemon: DaemonProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{daemon.url}/v1", api_key=daemon.token, max_retries=0)


def chat(d: DaemonProcess, **body: Any) -> Any:
    return d.post("/v1/chat/completions",
                  json={"model": MODEL, "messages": ASK, "max_tokens": 3, **body})


def complete(d: DaemonProcess, **body: Any) -> Any:
    return d.post("/v1/completions",
                  json={"model": MODEL, "prompt": "def add(a, b):", "max_tokens": 3, **body})


def refused(resp: Any, param: str) -> str:
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["param"] == param, error
    return str(error["message"])


@pytest.mark.parametrize("field", ["logit_bias_typo", "min_tokens", "repetition_penalty",
                                   "guided_json", "prompt_cache_key"])
def test_an_unknown_field_is_refused_by_name(daemon: DaemonProcess, field: str) -> None:
    message = refused(chat(daemon, **{field: 1}), field)
    assert f"'{field}'" in message and "not implement" in message
    assert refused(complete(daemon, **{field: 1}), field)


def test_an_unknown_nested_field_is_refused_by_its_path(daemon: DaemonProcess) -> None:
    refused(chat(daemon, stream=True, stream_options={"include_usage": True, "every": 1}),
            "stream_options.every")
    refused(chat(daemon, messages=[{"role": "user", "content": "x", "cache_control": {}}]),
            "messages[0].cache_control")
    refused(chat(daemon, tools=[{"type": "function", "function": {"name": "f", "x": 1}}]),
            "tools[0].function.x")


@pytest.mark.parametrize(("field", "value"), [
    ("n", 2), ("logit_bias", {"50256": -100}), ("store", True), ("reasoning_effort", "high"),
    ("verbosity", "low"), ("modalities", ["text", "audio"]), ("audio", {"voice": "alloy"}),
    ("prediction", {"type": "content", "content": "x"}), ("service_tier", "flex"),
    ("web_search_options", {}), ("functions", [{"name": "f"}]), ("function_call", "auto"),
])
def test_declared_but_unsupported_fields_are_refused(daemon: DaemonProcess, field: str,
                                                     value: Any) -> None:
    refused(chat(daemon, **{field: value}), field)


@pytest.mark.parametrize(("field", "value"), [
    ("echo", True), ("best_of", 3), ("suffix", "}"), ("n", 2)])
def test_unsupported_completion_fields_are_refused(daemon: DaemonProcess, field: str,
                                                   value: Any) -> None:
    refused(complete(daemon, **{field: value}), field)


def test_the_no_op_values_clients_send_pass(daemon: DaemonProcess) -> None:
    resp = chat(daemon, n=1, logit_bias={}, store=False, modalities=["text"], service_tier="auto",
                parallel_tool_calls=True, frequency_penalty=0.5, presence_penalty=-0.5,
                stream_options=None, functions=None, reasoning_effort=None,
                max_completion_tokens=3, top_p=0.9, seed=3, stop=["\n"],
                messages=[{"role": "user", "content": "hi", "name": "ann"},
                          {"role": "assistant", "content": "yes", "refusal": None,
                           "annotations": [], "audio": None, "function_call": None},
                          {"role": "user", "content": [{"type": "text", "text": "more"}]}])
    assert resp.status_code == 200, resp.text
    assert complete(daemon, echo=False, best_of=1, suffix=None, logprobs=None).status_code == 200


def test_penalties_are_bounded_as_openai_bounds_them(daemon: DaemonProcess) -> None:
    refused(chat(daemon, frequency_penalty=2.5), "frequency_penalty")
    refused(chat(daemon, presence_penalty=-3), "presence_penalty")


def test_chat_logprobs(client: openai.OpenAI) -> None:
    resp = client.chat.completions.create(model=MODEL, messages=ASK,
                                          max_tokens=4, logprobs=True, top_logprobs=3)
    choice = resp.choices[0]
    assert choice.logprobs is not None and choice.logprobs.content is not None
    entries = choice.logprobs.content
    assert "".join(e.token for e in entries) == choice.message.content
    for entry in entries:
        assert entry.logprob < 0 and entry.bytes == list(entry.token.encode())
        assert len(entry.top_logprobs) == 3
        assert entry.top_logprobs[0].token == entry.token
        chances = [math.exp(t.logprob) for t in entry.top_logprobs]
        assert chances == sorted(chances, reverse=True) and sum(chances) <= 1


def test_streamed_chat_logprobs(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(model=MODEL, messages=ASK,
                                            max_tokens=4, logprobs=True, stream=True)
    tokens = [e for c in stream if c.choices and c.choices[0].logprobs
              for e in c.choices[0].logprobs.content or []]
    assert len(tokens) == 4 and all(e.top_logprobs == [] for e in tokens)


def test_logprobs_off_by_default_and_top_needs_them(daemon: DaemonProcess) -> None:
    assert chat(daemon).json()["choices"][0]["logprobs"] is None
    refused(chat(daemon, top_logprobs=2), "top_logprobs")
    refused(chat(daemon, logprobs=True, top_logprobs=21), "top_logprobs")


def test_completion_logprobs(client: openai.OpenAI) -> None:
    resp = client.completions.create(model=MODEL, prompt="def add(a, b):", max_tokens=3,
                                     logprobs=2)
    choice = resp.choices[0]
    assert choice.logprobs is not None
    assert "".join(choice.logprobs.tokens or []) == choice.text
    assert choice.logprobs.text_offset == [0, len("sim0"), len("sim0 sim1")]
    assert all(len(top) == 2 for top in choice.logprobs.top_logprobs or [])


SCHEMA = {"type": "object", "properties": {
    "city": {"type": "string"}, "population": {"type": "integer", "minimum": 0},
    "tags": {"type": "array", "items": {"type": "string"}, "minItems": 1}},
    "required": ["city", "population", "tags"], "additionalProperties": False}


def test_response_format_json_schema_on_the_sim(client: openai.OpenAI) -> None:
    resp = client.chat.completions.create(
        model=MODEL, messages=ASK, max_tokens=64,
        response_format={"type": "json_schema",
                         "json_schema": {"name": "city", "schema": SCHEMA, "strict": True}})
    assert resp.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(resp.choices[0].message.content or ""), SCHEMA)


def test_response_format_json_object_and_bad_types(daemon: DaemonProcess) -> None:
    resp = chat(daemon, response_format={"type": "json_object"}, max_tokens=64)
    assert isinstance(json.loads(resp.json()["choices"][0]["message"]["content"]), dict)
    refused(chat(daemon, response_format={"type": "yaml"}), "response_format.type")


def test_user_and_metadata_are_in_the_trace(daemon: DaemonProcess) -> None:
    resp = chat(daemon, user="ann@example.com", metadata={"ticket": "T-1"},
                session_id="s-labels")
    assert resp.status_code == 200, resp.text
    events = daemon.get("/v1/sessions/s-labels/trace").json()["data"]
    [labels] = [e for e in events if e["kind"] == "request.client"]
    assert labels["request_id"] == resp.headers["X-Request-Id"]
    assert labels["data"]["user"] == "ann@example.com"
    assert labels["data"]["metadata"] == {"ticket": "T-1"}
    refused(chat(daemon, metadata={f"k{i}": "v" for i in range(17)}), "metadata")
