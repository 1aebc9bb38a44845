"""History that outlives the browser and the daemon, on a real daemon with the sim engine
(daemon/history/): its own series and its event log are in the store, read back through
GET /v1/history and /v1/events after a restart; a tenant sees its own events and the
cluster's, never another tenant's; bad input answers 400 naming the field."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.daemon_process import DaemonProcess
from tests.waiting import wait_for

MODEL = "sim-llama3-8b"
CONFIG = """
[slo.tenants.b]
program_idle_timeout_s = 1
"""
ENV = {"AGENTD_HISTORY_INTERVAL_S": "0.5"}


def _token(d: DaemonProcess, tenant: str) -> str:
    done = d.cli("token", "create", "--scope", "read,submit", "--name", tenant,
                 "--tenant", tenant)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def _chat(d: DaemonProcess, token: str, program: str) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 8, "program_id": program, "session_id": f"s-{program}"}
    r = d.post("/v1/chat/completions", token=token, json=body)
    assert r.status_code == 200, r.text


def _series(d: DaemonProcess, name: str) -> list[list[float]]:
    """The raw samples of the last 10 minutes (a step of 1 s folds nothing here)."""
    r = d.get(f"/v1/history?series={name}&since=-600&step=1")
    assert r.status_code == 200, r.text
    return [p for s in r.json()["series"] for p in s["points"]]


def _events(d: DaemonProcess, token: str | None = None, query: str = "") -> list[dict[str, Any]]:
    r = d.get(f"/v1/events?limit=1000{query}", token=token)
    assert r.status_code == 200, r.text
    return list(r.json()["data"])


def _kinds(events: list[dict[str, Any]]) -> set[str]:
    return {e["kind"] for e in events}


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[DaemonProcess, str, str]]:
    tmp = tmp_path_factory.mktemp("history")
    config = tmp / "agentd.toml"
    config.write_text(CONFIG)
    d = DaemonProcess(tmp / "data", env=ENV, extra_args=["--config", str(config)]).start()
    try:
        yield d, _token(d, "a"), _token(d, "b")
    finally:
        d.stop()


def test_history_and_events_survive_a_restart(world: tuple[DaemonProcess, str, str]) -> None:
    d, a, b = world
    for n in range(4):
        _chat(d, a, f"a-prog-{n}")
    _chat(d, b, "b-prog")  # tenant b's programs expire after 1 s idle
    # the worker's process dies: the supervisor restarts it
    worker = d.get("/v1/workers").json()["data"][0]
    os.kill(worker["pid"], signal.SIGKILL)
    wait_for(lambda: {"worker.exited", "program.expired"} <= _kinds(_events(d)), 30,
             lambda: f"the crash and the expiry as events: {_kinds(_events(d))}")
    served = wait_for(lambda: [p for p in _series(d, "requests_per_s") if p[1] > 0], 15,
                      "a sample with finished requests")
    ttft = _series(d, "ttft_p99_s")
    assert ttft and all(v > 0 for _, v in ttft), ttft
    kv = d.get("/v1/history?series=kv_used_pct").json()["series"]
    assert kv and kv[0]["label"] == worker["id"], kv
    before = {e["id"] for e in _events(d)}

    d.stop()
    d.start()
    after = _events(d)
    assert before <= {e["id"] for e in after}  # every event from before the restart
    assert {"daemon.stopped", "daemon.started", "worker.exited"} <= _kinds(after)
    assert [p for p in _series(d, "requests_per_s") if p in served] == served
    assert _series(d, "ttft_p99_s")[: len(ttft)] == ttft
    # a day's view reads the same samples through the minute tier's raw tail
    day = d.get("/v1/history?series=requests_per_s&since=-86400").json()
    assert day["tier_step_s"] == 60 and day["series"], day
    assert sum(v for _, v in day["series"][0]["points"]) > 0


def test_a_tenant_sees_its_events_and_the_clusters_not_another_tenants(
        world: tuple[DaemonProcess, str, str]) -> None:
    d, a, b = world
    _chat(d, b, "b-prog-2")
    wait_for(lambda: any(e["kind"] == "program.expired" and e["tenant"] == "b"
                         for e in _events(d)), 30, "b's expiry")
    everything = _events(d)
    mine_b = _events(d, b)
    mine_a = _events(d, a)
    assert any(e["tenant"] == "b" for e in mine_b)
    assert all(e["tenant"] in (None, "a") for e in mine_a), mine_a
    assert all(e["tenant"] in (None, "b") for e in mine_b), mine_b
    cluster = {e["id"] for e in everything if e["tenant"] is None}
    assert cluster and cluster <= {e["id"] for e in mine_a}
    assert "b-prog" not in str(mine_a) and "s-b-prog" not in str(everything)
    # the series are cluster aggregates: every reader gets the same
    # One fixed range, ending before the points still being written: both reads see the same.
    until = int(time.time()) - 5
    series = f"series=requests_per_s&since={until - 600}&until={until}"
    as_a = d.get(f"/v1/history?{series}", token=a).json()["series"]
    assert as_a[0]["points"] and as_a == d.get(f"/v1/history?{series}").json()["series"]


@pytest.mark.parametrize(("query", "field"), [
    ("/v1/history?series=nope", "series"), ("/v1/history?since=yesterday", "since"),
    ("/v1/history?until=nan", "until"), ("/v1/history?since=-10&until=-20", "since"),
    ("/v1/history?step=0.5", "step"), ("/v1/history?step=x", "step"),
    ("/v1/events?kind=worker.crash,nope", "kind"), ("/v1/events?since=x", "since"),
    ("/v1/events?limit=0", "limit")])
def test_bad_input_answers_400_naming_the_field(world: tuple[DaemonProcess, str, str],
                                                query: str, field: str) -> None:
    d = world[0]
    r = d.get(query)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == field, r.text


def test_a_read_only_token_reads_history(world: tuple[DaemonProcess, str, str],
                                         tmp_path: Path) -> None:
    d = world[0]
    done = d.cli("token", "create", "--scope", "read", "--name", "viewer")
    viewer = done.stdout.strip()
    assert httpx.get(f"{d.url}/v1/history", timeout=10).status_code == 401
    assert d.get("/v1/history?since=-60", token=viewer).status_code == 200
    assert d.get("/v1/events", token=viewer).status_code == 200


def test_a_storm_of_503s_is_a_few_events_with_their_count(tmp_path: Path) -> None:
    """No worker yet: every chat request is answered 503. They are counted into the
    http_5xx_per_s series and folded into one http.5xx event per sample interval."""
    d = DaemonProcess(tmp_path / "data", workers=0, env={"AGENTD_HISTORY_INTERVAL_S": "1"})
    d.start(wait_workers=0)
    try:
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 2}
        storm = 300
        started = time.monotonic()
        with httpx.Client(base_url=d.url, headers=d.auth_headers(), timeout=10) as c:
            for _ in range(storm):
                assert c.post("/v1/chat/completions", json=body).status_code == 503
        lasted_s = time.monotonic() - started

        def folded() -> list[dict[str, Any]]:
            rows = _events(d, query="&kind=http.5xx")
            return rows if sum(e["count"] for e in rows) >= storm else []

        rows = wait_for(folded, 15, lambda: f"{storm} 5xx answers folded: "
                                            f"{_events(d, query='&kind=http.5xx')}")
        assert sum(e["count"] for e in rows) == storm
        print(f"{storm} answers 503 in {lasted_s:.1f} s -> {len(rows)} http.5xx event(s)")
        # one row per sample interval (1 s) the storm lasted, not one per answer
        assert len(rows) <= lasted_s / 1.0 + 2, (len(rows), lasted_s)
        assert all(e["data"]["statuses"].keys() == {"503"} for e in rows)
        rate = wait_for(lambda: [p for p in _series(d, "http_5xx_per_s") if p[1] > 0], 10,
                        "a sample with 5xx answers")
        assert rate
    finally:
        d.stop()
