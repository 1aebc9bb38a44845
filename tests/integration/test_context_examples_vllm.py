"""The agentd.Context examples as workflow runs on the real engine: agentd → vLLM worker
(CPU) → SmolLM2-135M, cached-token counts from vLLM. SmolLM2's text is weak, so the checks
are on structure (constrained outputs parse), on the cache, and on where the calls ran.
Skipped when vLLM or the model is missing, unless AGENTD_REQUIRE_VLLM=1."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pytest

from tests.daemon_process import DaemonProcess
from tests.integration.test_context_examples import run
from tests.integration.test_vllm_daemon import BLOCK, vllm_daemon

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]
# Generous: a CPU engine on a machine shared with other work runs many times slower.
RUN_TIMEOUT_S = 600
ARGS: dict[str, dict[str, Any]] = {
    "react": {"question": "How many people live in Paris and Rome together?"},
    "tree_of_thought": {"problem": "Plan a three-day trip to Rome on a small budget. " * 12,
                        "breadth": 2, "keep": 1, "depth": 2},
    "extract": {"documents": ["Call Ada Lovelace at +44 20 7946 0000, London."]},
    "beam_search": {"prompt": "Name three colours of the rainbow.", "width": 2,
                    "max_tokens": 8},
}


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    d = vllm_daemon(tmp_path_factory.mktemp("ctx-examples-vllm") / "data", 64 << 20, 1024)
    yield d
    d.stop()


@pytest.fixture(scope="module")
def results(daemon: DaemonProcess) -> Iterator[dict[str, Future[Any]]]:
    """The four side by side: the engine batches their calls."""
    with ThreadPoolExecutor(4) as pool:
        yield {name: pool.submit(run, daemon, name, args, f"s-{name}", RUN_TIMEOUT_S)
               for name, args in ARGS.items()}


def test_react_on_vllm(results: dict[str, Future[Any]]) -> None:
    result = results["react"].result()
    steps = result["steps"]
    assert len(steps) == 8 and {s["action"] for s in steps} <= {"lookup", "calculate"}
    for before, step in itertools.pairwise(steps):
        assert step["cached_tokens"] >= before["prompt_tokens"] // BLOCK * BLOCK
    assert result["answer"].strip()


def test_tree_of_thought_on_vllm(results: dict[str, Future[Any]]) -> None:
    result = results["tree_of_thought"].result()
    shared = result["problem_tokens"] // BLOCK * BLOCK
    assert shared >= BLOCK
    assert all(n["cached_tokens"] >= shared and 1 <= n["score"] <= 10 for n in result["nodes"])


def test_extract_on_vllm(results: dict[str, Future[Any]]) -> None:
    (record,) = results["extract"].result()["records"]
    assert set(record["fields"]) == {"name", "phone", "city"}


def test_beam_search_on_vllm(results: dict[str, Future[Any]]) -> None:
    result = results["beam_search"].result()
    assert len(result["beams"]) == 2 and result["text"].strip()
    assert 1 <= result["steps"] <= 8
