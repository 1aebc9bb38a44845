"""Real agent frameworks run their tool loops through agentd (sim worker): the OpenAI
Agents SDK and LangGraph with LangChain's ChatOpenAI. The tool is called with arguments
the framework parsed, its result goes back to the model, and the loop ends."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.daemon_process import DaemonProcess
from tests.framework_loops import Loop, langgraph_loop, openai_agents_loop

MODEL = "sim-llama3-8b"


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    d = DaemonProcess(data_dir=tmp_path_factory.mktemp("frameworks") / "data").start()
    yield d
    d.stop()


def assert_one_call_then_an_answer(loop: Loop) -> None:
    # The sim calls a tool while the user's question is the last turn and answers in text
    # once the tool's result is: a text answer means the result came back.
    assert len(loop.cities) == 1 and loop.cities[0]
    assert loop.answer.startswith("sim0 sim1")


def test_openai_agents_sdk(daemon: DaemonProcess) -> None:
    loop = openai_agents_loop(daemon, MODEL, max_tokens=64)
    assert_one_call_then_an_answer(loop)
    first, second = loop.requests
    assert second.input_tokens > first.input_tokens + first.output_tokens


def test_openai_agents_sdk_streamed(daemon: DaemonProcess) -> None:
    assert_one_call_then_an_answer(openai_agents_loop(daemon, MODEL, stream=True))


def test_openai_agents_sdk_forced_first_call(daemon: DaemonProcess) -> None:
    assert_one_call_then_an_answer(openai_agents_loop(daemon, MODEL, first_choice="required"))


def test_langgraph(daemon: DaemonProcess) -> None:
    loop = langgraph_loop(daemon, MODEL)
    assert_one_call_then_an_answer(loop)
    kinds = [m.type for m in loop.requests]
    assert kinds == ["human", "ai", "tool", "ai"]
    call = loop.requests[1].tool_calls[0]
    assert call["name"] == "get_weather" and call["args"] == {"city": loop.cities[0]}
    assert loop.requests[2].tool_call_id == call["id"]


def readme_snippets() -> list[str]:
    """The Python blocks of README's "Use agentd from your framework"."""
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = readme.split("## Use agentd from your framework", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, re.DOTALL)


def test_the_readme_snippets_run(daemon: DaemonProcess) -> None:
    openai_agents, langgraph = readme_snippets()
    found: dict[str, Any] = {}
    for snippet in (openai_agents, langgraph):
        code = snippet.replace("http://127.0.0.1:8420", daemon.url)
        scope: dict[str, Any] = {"token": daemon.token, "model": MODEL}
        exec(compile(code, "README.md", "exec"), scope)  # our own README, as users run it
        found.update(scope)
    assert str(found["result"].final_output).startswith("sim0")
    assert [m.type for m in found["state"]["messages"]] == ["human", "ai", "tool", "ai"]
