"""An ended run that is no longer in the daemon's memory (let go after its keep time, or
from before a restart) is still listed and answered from its record file, and its events
are replayed from the trace."""

from __future__ import annotations

import json
from pathlib import Path

import httpx

from tests.daemon_process import DaemonProcess
from tests.integration.test_workflows import register

WORKFLOW = '''
def main(n: int) -> dict:
    return {"twice": 2 * n}
'''


def test_a_run_from_before_a_restart_is_read_from_its_record(tmp_path: Path) -> None:
    d = DaemonProcess(tmp_path / "data").start()
    try:
        assert register(d, "twice", {"main.py": WORKFLOW}).status_code == 201
        done = d.run_to_end({"workflow": "twice", "args": {"n": 21}})
        assert done["status"] == "finished" and done["result"] == {"twice": 42}
    finally:
        d.stop()
    d.start()
    try:
        listed = d.get("/v1/runs").json()["data"]
        assert [r["id"] for r in listed] == [done["id"]] and listed[0]["status"] == "finished"
        view = d.get(f"/v1/runs/{done['id']}").json()
        assert view["status"] == "finished" and view["result"] == {"twice": 42}
        assert view["program_id"] == done["program_id"]
        with httpx.stream("GET", f"{d.url}/v1/runs/{done['id']}/events",
                          headers=d.auth_headers(), timeout=10) as r:
            lines = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
        assert lines[-1] == "[DONE]"
        events = [json.loads(line) for line in lines[:-1]]
        # The record counts the events up to the run's end; the end's control hook follows.
        assert len(events) >= max(view["events"], done["events"]) > 0
        kinds = [e["kind"] for e in events]
        assert kinds[0] == "run.created" and "run.finished" in kinds
        assert all(e["run_id"] == done["id"] for e in events)
        cancelled = httpx.delete(f"{d.url}/v1/runs/{done['id']}", headers=d.auth_headers())
        assert cancelled.status_code == 200 and cancelled.json()["status"] == "finished"
        for unknown in ("run-0123456789abcdef", "run-..%2F..%2Fagentd"):
            r = d.get(f"/v1/runs/{unknown}")
            assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
    finally:
        d.stop()
