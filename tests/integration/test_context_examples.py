"""The agentd.Context examples (react, tree_of_thought, extract, beam_search) as workflow
runs in sandboxes on a daemon with a sim worker: each finishes with a result of its
documented shape, and the prefix cache serves what the program shares."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import pytest

from console.workflow_cmd import read_bundle
from tests.daemon_process import DaemonProcess
from tests.examples_support import EXAMPLES

BLOCK = 16  # the sim's block size


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    d = DaemonProcess(tmp_path_factory.mktemp("ctx-examples") / "data").start()
    yield d
    d.stop()


def run(d: DaemonProcess, name: str, args: dict[str, Any], session: str = "s-ctx",
        timeout: float = 120) -> Any:
    r = d.post("/v1/workflows", json={"name": name, "files": read_bundle(EXAMPLES / name),
                                      "entry": "main:main"})
    assert r.status_code == 201, r.text
    view = d.run_to_end({"workflow": name, "session_id": session, "args": args}, timeout)
    assert view["status"] == "finished", f"{view}\n{d.log()}"
    return view["result"]


def test_react_makes_eight_tool_calls_on_a_cached_context(daemon: DaemonProcess) -> None:
    result = run(daemon, "react", {"question": "How many people live in Paris and Rome?"})
    steps = result["steps"]
    assert len(steps) == 8 and {s["action"] for s in steps} <= {"lookup", "calculate"}
    assert all(s["observation"] for s in steps)
    for before, step in itertools.pairwise(steps):
        # Each step's prompt holds the one before: all its whole blocks come from the cache.
        assert step["cached_tokens"] >= before["prompt_tokens"] // BLOCK * BLOCK
    assert result["answer"] and result["context_tokens"] > steps[-1]["prompt_tokens"]
    # Each tool call ran inside ctx.idle(): a tool span of the run's program in the trace.
    trace = daemon.get("/v1/sessions/s-ctx/trace", params={"limit": 1000}).json()["data"]
    assert [e["kind"] for e in trace].count("context.idle.end") == 8


def test_tree_of_thought_forks_share_the_problem(daemon: DaemonProcess) -> None:
    result = run(daemon, "tree_of_thought", {"problem": "Plan a day in Rome. " * 6,
                                             "breadth": 2, "keep": 1, "depth": 2})
    nodes = result["nodes"]
    assert len(nodes) == 2 + 2 and [n["depth"] for n in nodes] == [1, 1, 2, 2]
    assert all(1 <= n["score"] <= 10 for n in nodes)
    shared = result["problem_tokens"] // BLOCK * BLOCK
    assert shared > 0 and all(n["cached_tokens"] >= shared for n in nodes)
    assert len(result["best_steps"]) == 2 and result["answer"]


def test_extract_parses_and_reuses_its_snapshot(daemon: DaemonProcess) -> None:
    docs = ["Call Ada Lovelace at +44 20 7946 0000, London.", "Alan Turing, Wilmslow."]
    first = run(daemon, "extract", {"documents": docs}, session="s-extract-1")
    again = run(daemon, "extract", {"documents": docs[:1]}, session="s-extract-2")
    assert first["snapshot_reused"] is False and again["snapshot_reused"] is True
    for record in first["records"] + again["records"]:
        assert set(record["fields"]) == {"name", "phone", "city"}
        assert record["cached_tokens"] >= first["instruction_tokens"] // BLOCK * BLOCK > 0


def test_beam_search_keeps_width_beams(daemon: DaemonProcess) -> None:
    result = run(daemon, "beam_search", {"prompt": "Name a colour.", "width": 2,
                                         "max_tokens": 3})
    assert result["steps"] == 3 and len(result["beams"]) == 2
    logprobs = [b["logprob"] for b in result["beams"]]
    assert all(lp < 0 for lp in logprobs) and result["text"]
