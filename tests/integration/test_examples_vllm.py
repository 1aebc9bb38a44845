"""The three example workflows end to end on a real daemon with one vLLM CPU worker serving
SmolLM2-135M-Instruct: submitted through agentctl and the REST API, run in sandboxes, every
LLM call served by the vLLM worker.

SmolLM2-135M's text is weak, so the checks are on each result's structure and on where
the calls ran, not on what the model said. Skipped when vLLM or the converted model is
missing, unless AGENTD_REQUIRE_VLLM=1.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pytest

from console.workflow_cmd import read_bundle
from tests.daemon_process import DaemonProcess
from tests.examples_support import EXAMPLES, load_example
from tests.integration.test_vllm_daemon import vllm_daemon

# Generous: a CPU engine on a machine shared with other work runs many times slower.
pytestmark = [pytest.mark.vllm, pytest.mark.timeout(600)]
KV_BYTES = 64 << 20
RUN_TIMEOUT_S = 420


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    d = vllm_daemon(tmp_path_factory.mktemp("examples-vllm") / "data", KV_BYTES, 1024)
    yield d
    d.stop()


def vllm_worker_id(d: DaemonProcess) -> str:
    [w] = [w for w in d.get("/v1/workers").json()["data"] if w["status"] == "healthy"]
    assert w["engine"] == "vllm", w
    return str(w["id"])


def session_requests(d: DaemonProcess, session: str) -> list[dict[str, Any]]:
    """Every LLM request of the session's programs (runs and their agents)."""
    programs = d.get("/v1/programs", params={"session": session, "limit": 1000}).json()["data"]
    return [r for p in programs for r in d.get(f"/v1/programs/{p['id']}").json()["requests"]]


def served_by_vllm(d: DaemonProcess, session: str) -> int:
    """How many LLM requests the session made; each must have finished on the vLLM worker."""
    worker = vllm_worker_id(d)
    requests = session_requests(d, session)
    for r in requests:
        assert r["worker_id"] == worker and r["status"] == "finished", r
        assert r["output_tokens"] > 0, r
    return len(requests)


def agentctl_submit(d: DaemonProcess, example: str, session: str,
                    args: dict[str, Any]) -> dict[str, Any]:
    """`agentctl submit DIR --args JSON --session S --follow --json`, as the docs say."""
    cmd = [sys.executable, "-m", "console.agentctl", "submit", str(EXAMPLES / example),
           "--args", json.dumps(args), "--session", session, "--follow", "--json",
           "--url", d.url, "--token", d.token]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}\n{d.log()}"
    run = json.loads(done.stdout)
    assert run["status"] == "finished", run
    return dict(run["result"])


def rest_submit(d: DaemonProcess, name: str, session: str, args: dict[str, Any]) -> dict[str, Any]:
    r = d.post("/v1/workflows", json={"name": name, "files": read_bundle(EXAMPLES / name),
                                      "entry": "main:main"})
    assert r.status_code == 201, r.text
    r = d.post("/v1/runs", json={"workflow": name, "session_id": session, "args": args})
    assert r.status_code == 201, r.text
    view = d.run_ended(r.json()["id"], RUN_TIMEOUT_S)
    assert view["status"] == "finished", f"{view}\n{d.log()}"
    return dict(view["result"])


def router_runs(d: DaemonProcess) -> list[dict[str, Any]]:
    return [agentctl_submit(d, "router", "s-router-vllm", {"request": request})
            for request in ("fix the bug in my python function", "how are you today?")]


def analyst_runs(d: DaemonProcess) -> list[dict[str, Any]]:
    return [rest_submit(d, "analyst", "s-analyst-vllm", args) for args in (
        {"ticker": "ACME"}, {"ticker": "ACME", "question": "Should I buy it?"})]


def swe_run(d: DaemonProcess) -> dict[str, Any]:
    return rest_submit(d, "swe", "s-swe-vllm",
                       {"request": "OAuth login", "size": 2, "max_retries": 4})


@pytest.fixture(scope="module")
def runs(daemon: DaemonProcess) -> Iterator[dict[str, Future[Any]]]:
    """Each example's runs, in order within an example and the three examples side by
    side: the engine batches their calls, which on CPU costs far less than running them
    one after another."""
    with ThreadPoolExecutor(3) as pool:
        yield {f.__name__: pool.submit(f, daemon) for f in (router_runs, analyst_runs, swe_run)}


def test_router_on_vllm(daemon: DaemonProcess, runs: dict[str, Future[Any]]) -> None:
    results = runs["router_runs"].result()
    for n, result in enumerate(results):
        assert set(result) == {"branch", "decided_by", "answer", "turns"}
        assert result["branch"] in ("chat", "coding")
        assert result["decided_by"] in ("llm", "rule")
        assert result["answer"].strip()
        assert result["turns"] == str(n + 1)  # the session's ManagedList grew
    # per run: one classifier call, a second when the first reply named no label (and a
    # third never), then one chat or two coding calls
    calls = served_by_vllm(daemon, "s-router-vllm")
    assert 4 + [r["decided_by"] for r in results].count("rule") <= calls <= 8


def test_analyst_on_vllm_with_a_follow_up(daemon: DaemonProcess,
                                          runs: dict[str, Future[Any]]) -> None:
    first, follow = runs["analyst_runs"].result()
    assert first["summary"].startswith("ACME: stock: ACME price ")
    assert [p.split(":")[0] for p in first["parts"]] == ["stock", "bonds", "news"]
    assert " Overview: " in first["summary"]
    assert len(first["futures"]) == 4  # the three analyses and the summary
    # answered from the report in the session's managed state: no second fan-out
    assert follow["summary"] == first["summary"] and "parts" not in follow
    assert follow["question"] == "Should I buy it?" and follow["answer"].strip()
    assert len(follow["futures"]) == 1
    assert served_by_vllm(daemon, "s-analyst-vllm") == 4 + 1


def test_swe_on_vllm_retries_until_tests_pass(daemon: DaemonProcess,
                                              runs: dict[str, Future[Any]]) -> None:
    result = runs["swe_run"].result()
    plan, attempts = result["plan"], result["attempts"]
    assert result["subtasks"] == 2 and len(plan) == 2 and len(set(plan)) == 2
    assert all(t.startswith("OAuth login: ") and len(t) > len("OAuth login: ") for t in plan)
    # the simulated test suite fails an area len(area) % 3 times: the retry loop ran that often
    failures_before_pass = load_example("swe/tester_impl.py").failures_before_pass
    assert attempts == [failures_before_pass(t) for t in plan]
    assert result["retries"] == sum(attempts)
    for task, attempt in zip(plan, attempts, strict=True):
        assert f"# {task} (attempt {attempt})\n" in result["code"]
    assert result["requests_in_session"] == 1
    # the planner, then a developer and a tester call per attempt
    assert served_by_vllm(daemon, "s-swe-vllm") == 1 + 2 * (2 + sum(attempts))
