"""The swap benchmark's daemon probe inside a real daemon: per-request intake records
that match the daemon's own dispatch times, loop lags with how the loop thread spent
them, and token lookups that went to the store."""

from __future__ import annotations

from pathlib import Path

import httpx

from bench.policy_swap_analysis import probe_path, read_probe
from tests.daemon_process import DaemonProcess

MODEL = "sim-llama3-8b"


def test_the_probe_records_each_requests_intake_and_the_loop(tmp_path: Path) -> None:
    probe = tmp_path / "probe"
    probe.mkdir()
    d = DaemonProcess(data_dir=tmp_path / "data", workers=1, env={
        "AGENTD_LOG_LEVEL": "warning", "AGENTD_SIM_TIME_SCALE": "0",
        "AGENTD_BENCH_PROBE": str(probe), "PYTHONPATH": probe_path()})
    d.start()
    try:
        with httpx.Client(base_url=d.url, headers=d.auth_headers(), timeout=30) as c:
            for n in range(5):
                r = c.post("/v1/chat/completions", json={
                    "model": MODEL, "max_tokens": 3, "program_id": "probe-p",
                    "messages": [{"role": "user", "content": f"step {n}"}]})
                assert r.status_code == 200, r.text
            program = c.get("/v1/programs/probe-p").json()
    finally:
        assert d.stop() == 0  # a clean stop flushes the probe's buffered records
    records = read_probe(probe)
    dispatched = sorted(req["dispatched_at"] for req in program["requests"])
    intake = sorted(records["intake"], key=lambda r: r[3])
    assert [r[3] for r in intake] == dispatched
    for arrived, queued, pump, at, own, headers in intake:
        assert headers <= arrived <= queued <= pump <= at
        assert own  # one client, an idle worker: each submit dispatches its own request
    assert all(a["await"] == "token lookup" and a["wall"] > 0 for a in records["awaits"])
    for lag in records["lags"]:
        assert {"lag", "end", "where", "cpu", "runq"} <= lag.keys()
