"""Plain-text views of the daemon's JSON: aligned tables, key/value blocks, trace lines.

Pure functions from API payloads to strings, so the CLI and tests share them and
nothing here touches the network. Ids stay whole in tables (they are meant to be
copied into the next command) and are shortened only in the dense trace view.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable, Sequence
from typing import Any

Row = Sequence[object]
PROGRAM_STATUSES = ("QUEUED", "REASONING", "ACTING", "PAUSED", "STOPPED", "FAILED")
_GENERATED_ID = re.compile(r"^([a-z]+)-([0-9a-f]{12,})$")


def table(headers: Row, rows: Iterable[Row]) -> str:
    cells = [[_cell(v) for v in headers], *[[_cell(v) for v in row] for row in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(cells[0]))]
    numeric = [all(_is_number(r[i]) for r in cells[1:]) and len(cells) > 1
               for i in range(len(widths))]
    lines = []
    for row in cells:
        parts = [v.rjust(w) if num else v.ljust(w) for v, w, num in zip(row, widths, numeric,
                                                                         strict=True)]
        lines.append("  ".join(parts).rstrip())
    return "\n".join(lines)


def keyvalues(pairs: Iterable[tuple[str, object]]) -> str:
    items = [(k, _cell(v)) for k, v in pairs]
    width = max((len(k) for k, _ in items), default=0) + 1
    return "\n".join(f"{(k + ':').ljust(width)} {v}" for k, v in items)


def _cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def _is_number(text: str) -> bool:
    return text == "-" or re.fullmatch(r"-?[\d.,]+%?", text) is not None


def short_id(value: str | None) -> str:
    """'req-4482b420af4e45fb' -> 'req-4482b420'; names people chose stay as they are."""
    if not value:
        return "-"
    m = _GENERATED_ID.match(value)
    if m:
        return f"{m.group(1)}-{m.group(2)[:8]}"
    return value if len(value) <= 24 else value[:23] + "…"


def engine_label(engine: str) -> str:
    # the simulated engine must never be mistaken for a real one in any view
    return "sim (simulated)" if engine == "sim" else engine


def seconds(value: float | None) -> str:
    if value is None:
        return "-"
    if value < 1:
        return f"{value * 1000:.0f}ms"
    if value < 120:
        return f"{value:.1f}s"
    if value < 7200:
        return f"{value / 60:.0f}m"
    return f"{value / 3600:.1f}h"


def ago(ts: float | None, now: float | None = None) -> str:
    if ts is None:
        return "-"
    return seconds(max(0.0, (time.time() if now is None else now) - ts)) + " ago"


def span(start: float | None, end: float | None) -> str:
    return "-" if start is None or end is None else seconds(end - start)


def nbytes(value: Any, missing: str = "-") -> str:
    """1536 -> '1.5 KiB'; anything that is not a number -> `missing`."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return missing
    size = float(value)
    for unit in ("B", "KiB", "MiB"):
        if size < 1024:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GiB"


def percent(part: float, whole: float) -> str:
    return "-" if not whole else f"{100 * part / whole:.0f}%"


# --- views --------------------------------------------------------------------------


def workers_table(workers: list[dict[str, Any]]) -> str:
    if not workers:
        return "no workers registered (start one with `agentd worker`, or restart the daemon)"
    rows = []
    for w in workers:
        st = w.get("stats") or {}
        cap = st.get("kv_capacity_tokens") or w["kv_capacity_tokens"]
        used = st.get("kv_used_tokens", 0)
        rows.append([
            w["id"], engine_label(w["engine"]), w["model"], w["status"],
            f"{used}/{cap}", percent(used, cap), st.get("running", "-"), st.get("waiting", "-"),
            w["inflight"], percent(st.get("prefix_cache_hits", 0),
                                   st.get("prefix_cache_queries", 0)),
            st.get("preemptions", "-"), node_label(w), f"{w['host']}:{w['pid']}",
            seconds(w["last_seen_s_ago"]),
        ])
    return table(["ID", "ENGINE", "MODEL", "STATUS", "KV TOKENS", "KV%", "RUNNING", "WAITING",
                  "INFLIGHT", "CACHE HIT", "PREEMPT", "NODE", "HOST:PID", "SEEN"], rows)


def node_label(w: dict[str, Any]) -> str:
    """The node a worker runs on and its data-parallel rank: `gpu-3 #1`."""
    node = w.get("node") or w.get("host") or "-"
    rank = w.get("dp_rank")
    return node if rank is None else f"{node} #{rank}"


def worker_lines(workers: list[dict[str, Any]]) -> list[str]:
    """One self-describing line per worker for `status`."""
    out = []
    for w in workers:
        st = w.get("stats") or {}
        cap = st.get("kv_capacity_tokens") or w["kv_capacity_tokens"]
        used = st.get("kv_used_tokens", 0)
        out.append(f"  {w['id']}  engine: {engine_label(w['engine'])}  model: {w['model']}  "
                   f"{w['status']}  kv {used}/{cap} tokens ({percent(used, cap)})  "
                   f"running {st.get('running', '-')}  waiting {st.get('waiting', '-')}")
    return out


def status_view(url: str, health: dict[str, Any], workers: list[dict[str, Any]],
                counts: dict[str, int], metrics: dict[str, float]) -> str:
    lines = [f"agentd at {url}: {health['status']}"]
    if health.get("store_error"):
        lines.append(f"store error: {health['store_error']}")
    lines.append(f"workers: {health['workers_healthy']} healthy of {health['workers']}   "
                 f"global queue: {health['queued']} requests")
    lines.extend(worker_lines(workers))
    total = sum(counts.values())
    by_status = "  ".join(f"{s} {counts.get(s, 0)}" for s in PROGRAM_STATUSES)
    lines.append(f"programs: {by_status}  (total {total})")
    if metrics:
        m = {k: int(v) for k, v in metrics.items()}
        lines.append(
            f"requests: {m.get('agentd_requests_total', 0)} total, "
            f"{m.get('agentd_requests_failed_total', 0)} failed, "
            f"{m.get('agentd_failovers_total', 0)} failovers   "
            f"tokens: {m.get('vllm:prompt_tokens_total', 0)} prompt, "
            f"{m.get('vllm:generation_tokens_total', 0)} generated")
    return "\n".join(lines)


def programs_table(programs: list[dict[str, Any]], total: int, now: float | None = None) -> str:
    if not programs:
        return "no programs match"
    rows = [[p["id"], p["session_id"], p["status"], p.get("worker_id"), p["context_tokens"],
             p["steps"], ago(p["created_at"], now), p.get("status_reason") or "-"]
            for p in programs]
    body = table(["ID", "SESSION", "STATUS", "WORKER", "CONTEXT", "STEPS", "CREATED",
                  "REASON"], rows)
    return f"{body}\n{len(programs)} of {total} programs"


def program_view(p: dict[str, Any], now: float | None = None) -> str:
    head = keyvalues([
        ("program", p["id"]), ("session", p["session_id"]),
        ("status", f"{p['status']} since {ago(p['status_since'], now)}"
                   + (f" ({p['status_reason']})" if p.get("status_reason") else "")),
        ("worker", p.get("worker_id")), ("context", f"{p['context_tokens']} tokens"),
        ("steps", p["steps"]), ("pinned", "yes" if p.get("pinned") else "no"),
        ("created", ago(p["created_at"], now)), ("active request", p.get("active_request")),
    ])
    requests = p.get("requests") or []
    if not requests:
        return f"{head}\n\nno requests yet"
    rows = [[r["id"], r["kind"], r["status"], r.get("worker_id"), r["prompt_tokens"],
             r["cached_tokens"], r["output_tokens"], r.get("finish_reason") or r.get("error"),
             span(r["queued_at"], r.get("dispatched_at")),
             span(r["queued_at"], r.get("first_token_at")),
             span(r["queued_at"], r.get("finished_at")), r.get("failovers", 0)]
            for r in requests]
    reqs = table(["REQUEST", "KIND", "STATUS", "WORKER", "PROMPT", "CACHED", "OUTPUT",
                  "FINISH", "QUEUE", "TTFT", "E2E", "FAILOVERS"], rows)
    return f"{head}\n\n{reqs}"


def sessions_table(sessions: list[dict[str, Any]], total: int, now: float | None = None) -> str:
    if not sessions:
        return "no sessions yet"
    rows = [[s["id"], s["tenant"], s["priority"], s["slo_class"], s.get("pinned_worker"),
             s["programs"], ago(s["created_at"], now), ago(s["updated_at"], now)]
            for s in sessions]
    body = table(["ID", "TENANT", "PRIORITY", "SLO", "PINNED", "PROGRAMS", "CREATED",
                  "UPDATED"], rows)
    return f"{body}\n{len(sessions)} of {total} sessions"


# --- trace timeline -----------------------------------------------------------------


TRACE_HEADER = f"{'TIME':>10}  {'KIND':<20} {'PROGRAM':<14}{'REQUEST':<14}DETAILS"


class Timeline:
    """Formats a session's events in order, relative to the first one.

    Stateful because a request's latency is only known by looking back at its
    `request.queued` event, which may have come on an earlier page.
    """

    def __init__(self) -> None:
        self.t0: float | None = None
        self._queued_at: dict[str, float] = {}

    def line(self, event: dict[str, Any]) -> str:
        """`+0.008s  request.first_token  p1  req-4482b420  worker=local-sim-0 ttft=8ms`"""
        ts = float(event["ts"])
        self.t0 = ts if self.t0 is None else self.t0
        rel = f"+{ts - self.t0:.3f}s"
        details = [*_details(event), *self._latency(event, ts)]
        return (f"{rel:>10}  {event['kind']:<20} {short_id(event.get('program_id')):<14}"
                f"{short_id(event.get('request_id')):<14}{'  '.join(details)}").rstrip()

    def _latency(self, event: dict[str, Any], ts: float) -> list[str]:
        rid = event.get("request_id")
        if not rid:
            return []
        if event["kind"] == "request.queued":
            self._queued_at[rid] = ts
            return []
        queued = self._queued_at.get(rid)
        if queued is None:
            return []
        if event["kind"] == "request.first_token":
            return [f"ttft={seconds(ts - queued)}"]
        if event["kind"] in ("request.finished", "request.failed", "request.aborted"):
            return [f"e2e={seconds(ts - queued)}"]
        return []


def _details(event: dict[str, Any]) -> list[str]:
    data = dict(event.get("data") or {})
    parts = []
    if event["kind"] == "program.status":
        parts.append(f"{data.pop('old', '?')} -> {data.pop('new', '?')}")
    if event.get("worker_id"):
        parts.append(f"worker={event['worker_id']}")
    for key, value in data.items():
        if value is None or value is False or value == "":
            continue
        parts.append(f"{key}={_compact(value)}")
    return parts


def _compact(value: object) -> str:
    text = value if isinstance(value, str) else str(value)
    text = " ".join(text.split())
    text = text if len(text) <= 60 else text[:59] + "…"
    return f'"{text}"' if " " in text else text
