"""The Perfetto export's slices nest: a request's queue wait and generation lie inside the
request's slice however the timestamps round to the file's 0.001 us."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from daemon.content.export import perfetto

# Seconds after the session's creation, at sub-microsecond resolution.
offsets = st.floats(min_value=0, max_value=1e4, allow_nan=False, allow_infinity=False)


def _record(start: float, dispatched: float, end: float) -> dict[str, Any]:
    request = {"id": "r", "program_id": "p", "queued_at": start, "dispatched_at": dispatched,
               "finished_at": end, "status": "finished", "model": "m", "worker_id": "w",
               "prompt_tokens": 1, "cached_tokens": 0, "output_tokens": 1,
               "finish_reason": "length", "failovers": 0}
    return {"session": {"id": "s", "tenant": "t", "created_at": 1.7e9},
            "programs": [{"id": "p"}], "requests": [request], "trace": [],
            "trace_truncated": False}


@given(st.lists(offsets, min_size=3, max_size=3))
def test_phases_nest_in_their_request(times: list[float]) -> None:
    start, dispatched, end = (1.7e9 + t for t in sorted(times))
    events = perfetto(_record(start, dispatched, end), now=end)["traceEvents"]
    [request] = [e for e in events if e.get("cat") == "request"]
    phases = {e["name"]: e for e in events if e.get("cat") == "phase"}
    assert set(phases) == {"queued", "generate"}
    # Float addition only: at 1e10 us one ulp is ~2e-6; the file's resolution is 1e-3 and
    # rounding each end and each duration on its own overran by up to 2e-3.
    slack = 1e-4
    for phase in phases.values():
        assert phase["ts"] >= request["ts"] - slack
        assert phase["ts"] + phase["dur"] <= request["ts"] + request["dur"] + slack
    queued, generate = phases["queued"], phases["generate"]
    assert abs(queued["ts"] + queued["dur"] - generate["ts"]) <= slack
