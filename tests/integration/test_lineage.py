"""Lineage inference through a real daemon: a client that sends no program_id, only the
conversation, runs as one program (daemon/core/lineage.py)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageFunctionToolCall

from tests.daemon_process import DaemonProcess
from tests.waiting import wait_for

MODEL = "sim-llama3-8b"
SYSTEM = {"role": "system", "content": "You are a coding agent. Use the shell tool."}
TASK = {"role": "user", "content": "Fix the failing test in the repository."}
SHELL: Any = {"type": "function", "function": {
    "name": "shell", "parameters": {"type": "object", "properties": {
        "command": {"type": "string"}}, "required": ["command"]}}}


def _chat(d: DaemonProcess, messages: list[dict[str, Any]], token: str | None = None,
          **extra: Any) -> httpx.Response:
    r = httpx.post(f"{d.url}/v1/chat/completions", headers=d.auth_headers(token), timeout=30,
                   json={"model": MODEL, "messages": messages, "max_tokens": 6, **extra})
    assert r.status_code == 200, r.text
    return r


def _turn(d: DaemonProcess, messages: list[dict[str, Any]], tool_output: str,
          token: str | None = None) -> tuple[str, list[dict[str, Any]]]:
    """One agent step: the call, then the conversation the next call sends."""
    body = _chat(d, messages, token).json()
    reply = body["choices"][0]["message"]
    return body["program_id"], [*messages, {"role": "assistant", "content": reply["content"]},
                                {"role": "user", "content": tool_output}]


def _trace(d: DaemonProcess, session: str) -> list[dict[str, Any]]:
    return list(d.get(f"/v1/sessions/{session}/trace", params={"limit": 1000}).json()["data"])


def _status(d: DaemonProcess, program: str) -> str:
    return str(d.get(f"/v1/programs/{program}").json()["status"])


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Any:
    d = DaemonProcess(tmp_path_factory.mktemp("lineage") / "data",
                      env={"AGENTD_LINEAGE_IDLE_S": "2"}).start()
    yield d
    d.stop()


def test_a_conversation_without_ids_is_one_program(daemon: DaemonProcess) -> None:
    first, messages = _turn(daemon, [SYSTEM, TASK], "$ pytest: 1 failed")
    second, messages = _turn(daemon, messages, "$ git diff: 3 lines")
    third, _ = _turn(daemon, messages, "$ pytest: all passed")
    assert first == second == third
    program = daemon.get(f"/v1/programs/{first}").json()
    assert program["steps"] == 3 and program["status"] == "ACTING", program
    inferred = [e for e in _trace(daemon, program["session_id"])
                if e["kind"] == "program.inferred"]
    assert [e["data"]["prefix_messages"] for e in inferred] == [3, 5]


def test_a_tool_calling_loop_without_ids_is_one_program(daemon: DaemonProcess) -> None:
    """The official client's own loop: the call it got goes back as an assistant turn
    (content None, its tool_calls, their arguments re-serialised as a framework may), then
    the tool's result; the program is the call's."""
    client = openai.OpenAI(base_url=f"{daemon.url}/v1", api_key=daemon.token, max_retries=0)
    messages: list[Any] = [SYSTEM, {"role": "user", "content": "List the repository."}]
    first = client.chat.completions.create(model=MODEL, messages=messages, tools=[SHELL],
                                           tool_choice="required", max_tokens=64)
    [call] = first.choices[0].message.tool_calls or []
    assert isinstance(call, ChatCompletionMessageFunctionToolCall)
    arguments = json.dumps(json.loads(call.function.arguments), indent=1)
    messages += [{"role": "assistant", "content": None, "tool_calls": [
        {"id": call.id, "type": "function",
         "function": {"name": call.function.name, "arguments": arguments}}]},
                 {"role": "tool", "tool_call_id": call.id, "content": "README.md src tests"}]
    second = client.chat.completions.create(model=MODEL, messages=messages, tools=[SHELL],
                                            max_tokens=16)
    program = first.model_extra["program_id"]  # type: ignore[index]
    assert second.model_extra["program_id"] == program  # type: ignore[index]


def test_the_reply_must_be_the_one_the_program_gave(daemon: DaemonProcess) -> None:
    first, messages = _turn(daemon, [SYSTEM, {"role": "user", "content": "task two"}], "ok")
    messages[2] = {"role": "assistant", "content": "an answer this daemon never gave"}
    assert _chat(daemon, messages).json()["program_id"] != first
    # Whitespace around the reply is no part of it (clients strip replies).
    stripped, messages = _turn(daemon, [SYSTEM, {"role": "user", "content": "task three"}],
                               "ok")
    messages[2]["content"] = f"\n{messages[2]['content']}  "
    assert _chat(daemon, messages).json()["program_id"] == stripped


def test_an_idle_inferred_program_ends_and_is_not_joined_again(daemon: DaemonProcess) -> None:
    first, messages = _turn(daemon, [SYSTEM, {"role": "user", "content": "idle task"}], "ok")
    wait_for(lambda: _status(daemon, first) == "STOPPED", 15, f"{first} to end when idle")
    program = daemon.get(f"/v1/programs/{first}").json()
    assert "idle" in program["status_reason"], program
    assert _chat(daemon, messages).json()["program_id"] != first


def test_tenants_never_join_each_others_programs(daemon: DaemonProcess) -> None:
    tokens = []
    for tenant in ("ta", "tb"):
        done = daemon.cli("token", "create", "--scope", "read,submit", "--name", tenant,
                          "--tenant", tenant)
        assert done.returncode == 0, done.stderr
        tokens.append(done.stdout.strip())
    a, b = tokens
    conversation = [SYSTEM, {"role": "user", "content": "the same task for both"}]
    a_program, a_messages = _turn(daemon, conversation, "same output", token=a)
    # B sends A's exact history, A's reply included: B runs in a program of its own.
    b_program = _chat(daemon, a_messages, token=b).json()["program_id"]
    assert b_program != a_program
    assert _chat(daemon, a_messages, token=a).json()["program_id"] == a_program


def test_a_named_program_is_never_inferred(daemon: DaemonProcess) -> None:
    first, messages = _turn(daemon, [SYSTEM, {"role": "user", "content": "named"}], "ok")
    named = _chat(daemon, messages, program_id="p-named").json()["program_id"]
    assert named == "p-named" != first


def test_inference_off_makes_every_request_a_program(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    d = DaemonProcess(tmp_path_factory.mktemp("off") / "data",
                      env={"AGENTD_LINEAGE_INFERENCE": "false"}).start()
    try:
        first, messages = _turn(d, [SYSTEM, TASK], "ok")
        second, _ = _turn(d, messages, "ok")
        assert first != second
        assert _status(d, first) == "STOPPED"  # released with its reply, as before
    finally:
        d.stop()
