"""A context's tool calls go to the daemon's tool manager, and their output streams back
into the context as it arrives (issue 26 item 4): the streamed exec over REST, and
agentd.Context.tool filling the output while the tool still runs."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import agentd
from agentd.runtime import LLMError
from tests.daemon_process import DaemonProcess
from tests.streams import streamed_exec

# Three lines a third of a second apart: a tool whose output comes while it runs.
SLOW = "for i in 1 2 3; do echo line$i; sleep 0.3; done; echo oops >&2"


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    tmp = tmp_path_factory.mktemp("context-tools")
    cfg = tmp / "agentd.toml"
    cfg.write_text('[tools.shell]\nbackend = "process"\ncommand = []\nexec_timeout_s = 10\n')
    d = DaemonProcess(tmp / "data", extra_args=["--config", str(cfg)]).start()
    yield d
    d.stop()


def _program(d: DaemonProcess, program: str) -> None:
    r = d.post("/v1/contexts/generate", json={
        "model": "sim-llama3-8b", "program_id": program, "session_id": program,
        "token_ids": [1, 2, 3], "max_tokens": 1})
    assert r.status_code == 200, r.text


def test_a_streamed_exec_sends_the_output_while_the_command_runs(daemon: DaemonProcess) -> None:
    _program(daemon, "stream-a")
    events = streamed_exec(daemon, "stream-a", "shell", {"command": SLOW})
    kinds = [k for _, k, _ in events]
    assert kinds[-1] == "result" and kinds.count("output") >= 3, kinds
    stdout = "".join(d["text"] for _, k, d in events if k == "output" and d["stream"] == "stdout")
    assert stdout == "line1\nline2\nline3\n"
    assert any(d["stream"] == "stderr" for _, k, d in events if k == "output")
    first_output = next(t for t, k, _ in events if k == "output")
    assert events[-1][0] - first_output > 0.5  # it came while the command still ran
    result = events[-1][2]
    assert result["exit_code"] == 0 and result["stdout"] == stdout


def test_a_failing_command_is_a_result_and_bad_input_is_a_400(daemon: DaemonProcess) -> None:
    _program(daemon, "stream-b")
    events = streamed_exec(daemon, "stream-b", "shell", {"command": "echo half; exit 3"})
    assert events[-1][1] == "result" and events[-1][2]["exit_code"] == 3
    r = daemon.post("/v1/programs/stream-b/tools/shell/exec",
                    json={"command": "true", "stream": "yes"})
    assert r.status_code == 400 and "stream" in r.text


def test_context_tool_fills_the_output_as_it_arrives(daemon: DaemonProcess, local: None) -> None:
    ctx = agentd.Context(program_id="ctx-tool", session_id="ctx-tool")
    ctx.system("You run commands.").user("Run the tests.")
    ctx.generate(max_tokens=4, temperature=0)
    before = len(ctx.token_ids)
    heard: list[tuple[str, str]] = []
    result = ctx.tool("shell", SLOW, fill_every=1,
                      on_output=lambda stream, text: heard.append((stream, text)))
    assert result["exit_code"] == 0 and result["stdout"] == "line1\nline2\nline3\n"
    assert ("stderr", "oops\n") in heard
    assert len(ctx.token_ids) > before and not ctx.pending
    trace = daemon.get("/v1/sessions/ctx-tool/trace", params={"limit": 1000}).json()["data"]
    fills = [e for e in trace if e["kind"] == "context.fill"]
    assert len(fills) >= 3, [e["kind"] for e in trace]  # one per line, while it ran
    # With fill_every=0 the output is appended for the next call to tokenize.
    ctx.tool("shell", "echo done", fill_every=0)
    assert ctx.pending


def test_context_tool_needs_a_program_and_a_known_tool(daemon: DaemonProcess,
                                                       local: None) -> None:
    with pytest.raises(ValueError, match="needs a program"):
        agentd.Context().tool("shell", "true")
    ctx = agentd.Context(program_id="ctx-tool-b", session_id="ctx-tool-b")
    ctx.user("hi")
    ctx.generate(max_tokens=1)
    with pytest.raises(LLMError, match="nosuch"):
        ctx.tool("nosuch", "true")
