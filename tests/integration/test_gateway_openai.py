"""The official openai client against a real daemon with a real sim worker over ZeroMQ."""

from __future__ import annotations

import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from console.client import metric_sums
from tests.daemon_process import DaemonProcess

MODEL = "sim-llama3-8b"


@pytest.fixture
def client(sim_daemon: DaemonProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{sim_daemon.url}/v1", api_key=sim_daemon.token, max_retries=0)


def test_models_lists_the_sim_model(client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list()] == [MODEL]


def test_chat_completion_reports_usage_and_program(client, sim_daemon) -> None:  # type: ignore[no-untyped-def]
    resp = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "plan the repository fix"}],
        max_tokens=7, extra_body={"program_id": "p-chat", "session_id": "s-chat"},
    )
    assert resp.choices[0].finish_reason == "length"
    assert resp.usage is not None and resp.usage.completion_tokens == 7
    assert resp.usage.prompt_tokens > 0
    assert resp.usage.prompt_tokens_details.cached_tokens == 0
    program = sim_daemon.get("/v1/programs/p-chat").json()
    assert program["session_id"] == "s-chat"
    assert program["status"] == "ACTING"  # between requests
    [req] = program["requests"]
    assert req["status"] == "finished"
    assert req["prompt_tokens"] == resp.usage.prompt_tokens
    assert req["output_tokens"] == 7
    assert program["context_tokens"] == resp.usage.prompt_tokens + 7


def test_streaming_chat_with_usage(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "stream please"}], max_tokens=12,
        stream=True, stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finishes = [c.choices[0].finish_reason for c in chunks
                if c.choices and c.choices[0].finish_reason]
    assert finishes == ["length"]
    assert len(text.split()) == 12
    usage = chunks[-1].usage
    assert usage is not None and usage.completion_tokens == 12


def test_text_completion(client: openai.OpenAI) -> None:
    resp = client.completions.create(model=MODEL, prompt="def add(a, b):", max_tokens=4)
    assert resp.choices[0].text.split() and resp.usage.completion_tokens == 4  # type: ignore[union-attr]


def test_program_steps_hit_the_prefix_cache(client: openai.OpenAI,
                                            sim_daemon: DaemonProcess) -> None:
    history: list[ChatCompletionMessageParam] = [
        {"role": "system", "content": "You are a careful agent. " * 20},
        {"role": "user", "content": "step one"}]
    first = client.chat.completions.create(
        model=MODEL, messages=history, max_tokens=5, extra_body={"program_id": "p-cache"})
    history += [{"role": "assistant", "content": first.choices[0].message.content},
                {"role": "user", "content": "tool output: ok. step two"}]
    second = client.chat.completions.create(
        model=MODEL, messages=history, max_tokens=5, extra_body={"program_id": "p-cache"})
    assert second.usage is not None and first.usage is not None
    cached = second.usage.prompt_tokens_details
    assert cached is not None and cached.cached_tokens is not None and cached.cached_tokens > 0
    assert second.usage.prompt_tokens > first.usage.prompt_tokens
    program = sim_daemon.get("/v1/programs/p-cache").json()
    assert program["steps"] == 2


def test_headers_select_program_and_release_stops_it(client, sim_daemon) -> None:  # type: ignore[no-untyped-def]
    client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=2,
        extra_headers={"X-Program-Id": "p-hdr", "X-Session-Id": "s-hdr"},
    )
    assert sim_daemon.get("/v1/programs/p-hdr").json()["session_id"] == "s-hdr"
    r = sim_daemon.post("/v1/programs/p-hdr/release")
    assert r.status_code == 200 and r.json()["status"] == "STOPPED"
    assert sim_daemon.get("/v1/programs/p-hdr").json()["status"] == "STOPPED"
    with pytest.raises(openai.ConflictError, match="released"):
        client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "again"}], max_tokens=2,
            extra_body={"program_id": "p-hdr"},
        )


def test_session_trace_is_ordered(client, sim_daemon) -> None:  # type: ignore[no-untyped-def]
    client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "trace me"}], max_tokens=3,
        extra_body={"program_id": "p-trace", "session_id": "s-trace"},
    )
    events = sim_daemon.get("/v1/sessions/s-trace/trace").json()["data"]
    kinds = [e["kind"] for e in events if e["kind"].startswith("request.")]
    assert kinds == ["request.queued", "request.dispatched", "request.first_token",
                     "request.finished"]
    stamps = [e["ts"] for e in events]
    assert stamps == sorted(stamps)
    assert events[0]["kind"] == "program.created"
    statuses = [e["data"]["new"] for e in events if e["kind"] == "program.status"]
    assert statuses == ["REASONING", "ACTING"]
    sessions = sim_daemon.get("/v1/sessions").json()["data"]
    assert any(s["id"] == "s-trace" and s["programs"] == 1 for s in sessions)
    page = sim_daemon.get("/v1/sessions/s-trace/trace", params={"limit": 2}).json()
    assert len(page["data"]) == 2 and page["next_after"] == page["data"][-1]["id"]


def test_metrics_use_vllm_names(client, sim_daemon) -> None:  # type: ignore[no-untyped-def]
    client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "count me"}], max_tokens=2)
    text = sim_daemon.get("/metrics").text
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting",
                 "vllm:kv_cache_usage_perc", "vllm:prefix_cache_queries_total",
                 "vllm:prefix_cache_hits_total", "vllm:num_preemptions_total",
                 "vllm:time_to_first_token_seconds_bucket", 'agentd_programs{status="ACTING"}'):
        assert name in text, name
    sums = metric_sums(text)
    assert sums["vllm:e2e_request_latency_seconds_count"] == 1
    assert sums["vllm:request_success_total"] == 1 and sums["vllm:generation_tokens_total"] == 2


def test_openapi_schema_is_published(sim_daemon: DaemonProcess) -> None:
    schema = sim_daemon.get("/schema/openapi.json").json()
    for path in ("/v1/chat/completions", "/v1/programs", "/v1/sessions/{session_id}/trace"):
        assert path in schema["paths"], path
