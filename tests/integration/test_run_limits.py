"""What a run may hand back and ask for, on a real daemon with real sandboxes: results are
capped at max_result_bytes (the daemon never reads a larger one, even one written past the
sandbox's own check), failures and events carry cut texts, and only an operator may raise
a run's limits above the defaults."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from daemon.config import Config
from daemon.runtime.runs import DEFAULT_LIMITS, EVENT_TEXT_CHARS
from tests.daemon_process import DaemonProcess

CAP = Config().max_result_bytes
# A whole GET /v1/runs of this module's runs: a few capped results and cut errors.
LISTING_BYTES = 4 * CAP

BIG_RESULT = "def main(n: int):\n    return 'x' * n\n"
# The result channel is the sandbox's own stdout copy; code that finds it can write a
# result line of any size past the sandbox's check, then leave before the sandbox writes.
PAST_THE_CHECK = """import gc, io, json, os

def main(n: int):
    out = next(o for o in gc.get_objects() if isinstance(o, io.TextIOWrapper)
               and isinstance(o.name, int) and o.name > 2 and "w" in o.mode)
    out.write(json.dumps({"ok": True, "result": "x" * n}) + "\\n")
    out.flush()
    os._exit(0)
"""
BIG_ERROR = "def main(n: int):\n    raise ValueError('x' * n)\n"
BIG_EVENT = """import agentd

@agentd.agent
class Loud:
    def go(self, n):
        raise ValueError('x' * n)

def main(n: int):
    try:
        return Loud().go(n) + 1
    except ValueError:
        return 'caught'
"""


@pytest.fixture(scope="module")
def d(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    daemon = DaemonProcess(tmp_path_factory.mktemp("limits") / "data").start()
    for name, src in (("big", BIG_RESULT), ("past", PAST_THE_CHECK), ("raise", BIG_ERROR),
                      ("loud", BIG_EVENT)):
        r = daemon.post("/v1/workflows", json={"name": name, "files": {"main.py": src},
                                                "entry": "main:main"})
        assert r.status_code == 201, r.text
    yield daemon
    daemon.stop()


def _peak_rss_mb(d: DaemonProcess) -> float:
    assert d.proc is not None
    status = Path(f"/proc/{d.proc.pid}/status").read_text()
    match = re.search(r"VmHWM:\s+(\d+) kB", status)
    assert match is not None
    return int(match.group(1)) / 1024


def _listing_bytes(d: DaemonProcess) -> int:
    r = d.get("/v1/runs")
    assert r.status_code == 200
    return len(r.content)


def test_a_60_mb_result_fails_naming_the_cap_and_is_never_held(d: DaemonProcess) -> None:
    small = d.run_to_end({"workflow": "big", "args": {"n": CAP // 2}})
    assert small["status"] == "finished" and len(small["result"]) == CAP // 2
    peak = _peak_rss_mb(d)
    for _ in range(2):
        view = d.run_to_end({"workflow": "big", "args": {"n": 60_000_000}}, timeout=60)
        assert view["status"] == "failed" and view["result"] is None, view["status"]
        assert view["error"]["kind"] == "system"
        line = 60_000_000 + len(json.dumps({"ok": True, "result": ""}))
        assert view["error"]["reason"] == (f"result too large: {line} bytes of JSON, over "
                                           f"the daemon's max_result_bytes ({CAP})")
        assert len(d.get(f"/v1/runs/{view['id']}").content) < 2 * CAP
    # the daemon's peak memory did not take in a 60 MB result (it used to hold each one)
    assert _peak_rss_mb(d) - peak < 30
    assert _listing_bytes(d) < LISTING_BYTES


@pytest.mark.parametrize("size", [CAP + 4096, 5 * CAP])
def test_a_result_written_past_the_sandbox_check_is_refused_by_the_daemon(
        d: DaemonProcess, size: int) -> None:
    """Just over the cap: read whole, then refused; far over: the daemon stops reading
    past the cap plus the room for a failure's report and kills the sandbox."""
    view = d.run_to_end({"workflow": "past", "args": {"n": size}})
    assert view["status"] == "failed" and view["result"] is None
    assert view["error"]["reason"].startswith("result too large")
    assert f"max_result_bytes ({CAP})" in view["error"]["reason"]
    assert _listing_bytes(d) < LISTING_BYTES


def test_a_huge_exception_message_is_cut_in_the_failure(d: DaemonProcess) -> None:
    view = d.run_to_end({"workflow": "raise", "args": {"n": 10_000_000}})
    error = view["error"]
    assert view["status"] == "failed" and error["kind"] == "user" and error["type"] == "ValueError"
    assert error["message"].endswith("more characters]") and len(error["message"]) < 3000
    assert len(error["traceback"]) < 10_000 and len(error["reason"]) < 3000
    assert _listing_bytes(d) < LISTING_BYTES


def test_a_huge_error_in_an_event_is_cut(d: DaemonProcess) -> None:
    view = d.run_to_end({"workflow": "loud", "args": {"n": 1_000_000}})
    assert view["status"] == "finished" and view["result"] == "caught", view
    with httpx.stream("GET", f"{d.url}/v1/runs/{view['id']}/events", timeout=30,
                      headers=d.auth_headers()) as resp:
        body = resp.read()
    assert b'"kind": "future.resolved"' in body and b"ValueError: xxx" in body
    assert len(body) < 20 * EVENT_TEXT_CHARS + 50_000  # not the 1 MB message


# --- who may raise limits ------------------------------------------------------------


def _submit_token(d: DaemonProcess, tenant: str) -> str:
    done = d.cli("token", "create", "--scope", "read,submit", "--name", f"{tenant}-client",
                 "--tenant", tenant)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def _start(d: DaemonProcess, token: str | None, limits: dict[str, float]) -> httpx.Response:
    return d.post("/v1/runs", token=token,
                  json={"workflow": "big", "args": {"n": 1}, "limits": limits})


ABOVE = {"disk_mb": 16384, "memory_mb": 16384, "processes": 4096, "timeout_s": 86400,
         "cpu_s": DEFAULT_LIMITS["cpu_s"] + 1}


@pytest.mark.parametrize("field", sorted(ABOVE))
def test_a_submit_token_may_not_raise_a_limit(d: DaemonProcess, field: str) -> None:
    token = _submit_token(d, f"t-{field.replace('_', '-')}")
    assert d.post("/v1/workflows", token=token, json={
        "name": "big", "files": {"main.py": BIG_RESULT}, "entry": "main:main"}).status_code == 201
    r = _start(d, token, {field: ABOVE[field]})
    assert r.status_code == 403, r.text
    error = r.json()["error"]
    assert error["param"] == f"limits.{field}" and "operator" in error["message"]
    # at or below the defaults it may run
    within = {field: DEFAULT_LIMITS[field] if field != "memory_mb" else 512}
    r = _start(d, token, within)
    assert r.status_code == 201, r.text
    assert d.run_ended(r.json()["id"])["status"] == "finished"


def test_the_operator_may_raise_limits(d: DaemonProcess) -> None:
    r = _start(d, None, {"memory_mb": 2048, "timeout_s": 1200, "processes": 256})
    assert r.status_code == 201, r.text
    view = d.run_ended(r.json()["id"])
    assert view["status"] == "finished" and view["limits"]["memory_mb"] == 2048
