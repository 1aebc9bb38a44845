"""A session's record as a Chrome / Perfetto trace-event file (the JSON object format of
the Trace Event Format, which ui.perfetto.dev and chrome://tracing open).

One process is the session; each program is a thread of it (a track, named by a
metadata event), in the order the programs started. Each request is a complete event
("ph": "X") from queued to finished, with its queue wait and its generation as complete
events nested inside it; each tool execution is a complete event on its program's track;
each trace event of the session is an instant event ("ph": "i") on its program's track,
or on the session's own when it names no program.
Timestamps are microseconds from the session's first moment, so they start near 0.
"""

from __future__ import annotations

from typing import Any

PID = 1
SESSION_TID = 0  # the session's own track: trace events that name no program
US = 1_000_000


def perfetto(record: dict[str, Any], now: float) -> dict[str, Any]:
    session = record["session"]
    starts = [session["created_at"]] + [r["queued_at"] for r in record["requests"]] + \
        [e["ts"] for e in record["trace"]]
    origin = min(starts)

    def us(t: float) -> float:
        return float(round((t - origin) * US, 3))

    def dur(start: float, end: float) -> float:
        # From the rounded ends, so a slice nested in another ends inside it exactly.
        return round(us(end) - us(start), 3)

    tids = {p["id"]: n for n, p in enumerate(record["programs"], start=1)}
    events: list[dict[str, Any]] = [
        {"ph": "M", "name": "process_name", "pid": PID, "tid": SESSION_TID,
         "args": {"name": f"session {session['id']} ({session['tenant']})"}},
        {"ph": "M", "name": "thread_name", "pid": PID, "tid": SESSION_TID,
         "args": {"name": "session"}},
    ]
    for program_id, tid in tids.items():
        events.append({"ph": "M", "name": "thread_name", "pid": PID, "tid": tid,
                       "args": {"name": f"program {program_id}"}})
        events.append({"ph": "M", "name": "thread_sort_index", "pid": PID, "tid": tid,
                       "args": {"sort_index": tid}})
    for req in record["requests"]:
        events.extend(_request_events(req, tids.get(req["program_id"], SESSION_TID), us, dur,
                                      now))
    for x in tool_execs(record["trace"], now):
        events.append({"ph": "X", "name": f"tool {x['tool']}", "cat": "tool", "pid": PID,
                       "tid": tids.get(x["program_id"], SESSION_TID), "ts": us(x["start"]),
                       "dur": dur(x["start"], x["end"]),
                       "args": {"exec_id": x["exec_id"], "ok": x["ok"],
                                "reason": x["reason"]}})
    for e in record["trace"]:
        tid = tids.get(e["program_id"] or "", SESSION_TID)
        args = {**(e["data"] or {}), **{k: e[k] for k in ("request_id", "worker_id")
                                        if e.get(k)}}
        events.append({"ph": "i", "s": "t", "name": e["kind"], "cat": "trace",
                       "pid": PID, "tid": tid, "ts": us(e["ts"]), "args": args})
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"session_id": session["id"], "origin_unix_s": origin,
                          "trace_truncated": record["trace_truncated"]}}


def tool_execs(trace: list[dict[str, Any]], now: float) -> list[dict[str, Any]]:
    """Tool executions from their tool.exec.start / tool.exec.end trace events, paired by
    program and exec id; one still running ends at `now`."""
    started: dict[tuple[str, Any], dict[str, Any]] = {}
    out = []
    for e in trace:
        key = (e["program_id"] or "", (e["data"] or {}).get("exec_id"))
        if e["kind"] == "tool.exec.start":
            started[key] = {"program_id": key[0], "exec_id": key[1],
                            "tool": (e["data"] or {}).get("tool", "tool"), "start": e["ts"],
                            "end": now, "ok": None, "reason": "running"}
            out.append(started[key])
        elif e["kind"] == "tool.exec.end" and key in started:
            x = started.pop(key)
            x.update(end=max(e["ts"], x["start"]), ok=e["data"].get("ok"),
                     reason=e["data"].get("reason"))
    return out


def _request_events(req: dict[str, Any], tid: int, us: Any, dur: Any, now: float
                    ) -> list[dict[str, Any]]:
    """The request's slice and, nested in it, its queue wait and its generation. A request
    still running ends at `now` in the file."""
    start, end = req["queued_at"], req["finished_at"] or now
    end = max(end, start)
    args = {k: req[k] for k in ("id", "status", "model", "worker_id", "prompt_tokens",
                                "cached_tokens", "output_tokens", "finish_reason",
                                "failovers")}
    if req.get("content") is not None:
        args["completion"] = req["content"]["completion"]
    out = [{"ph": "X", "name": f"llm {req['model']}", "cat": "request", "pid": PID,
            "tid": tid, "ts": us(start), "dur": dur(start, end), "args": args}]
    dispatched = req["dispatched_at"]
    if dispatched is not None:
        dispatched = min(max(dispatched, start), end)
        out.append({"ph": "X", "name": "queued", "cat": "phase", "pid": PID, "tid": tid,
                    "ts": us(start), "dur": dur(start, dispatched)})
        out.append({"ph": "X", "name": "generate", "cat": "phase", "pid": PID, "tid": tid,
                    "ts": us(dispatched), "dur": dur(dispatched, end),
                    "args": {"worker_id": req["worker_id"]}})
    return out
