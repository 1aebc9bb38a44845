"""SVG snapshots of every view at a fixed size, fed from a fixed dataset.

The dataset is served in-process at the HTTP layer (an httpx transport), so the app
runs its real client, poller and screens; only the answers are fixed, and the clock
is the dataset's. These tests check rendering; behaviour against a live daemon is
tested in test_tui.py. Update the SVGs with `pytest --snapshot-update` after a
deliberate change, and look at them (the failure report shows both).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

import httpx
from textual.pilot import Pilot
from textual.widgets import TextArea

from console.client import AsyncAgentdClient
from console.tui.app import AgentdTui
from console.tui.screens.policy_editor import PolicyEditorScreen
from console.tui.screens.trace import TraceScreen
from console.tui.widgets.keyed_table import KeyedTable
from console.tui.widgets.policy_pane import PolicyPane
from tests.ui.test_tui import until

SIZE = (120, 34)
URL = "http://agentd.test:8420"
NOW = 1_760_000_000.0
RATES = [(0, 0), (410, 3), (980, 9), (1320, 14), (2210, 21), (2890, 27), (3150, 29),
         (4020, 35), (4880, 43), (5330, 46), (6120, 52), (6700, 55)]  # generated, SLO met
LAST_METRICS_CALL = len(RATES) + 2  # the script's end, then a poll that changes nothing

POLICY_SOURCE = '''\
"""Canary: sticky placement, but pause the longest acting program first."""

from scheduling.kv.baselines import StickyPolicy


class Canary(StickyPolicy):
    name = "canary"

    def decide(self, view, now):
        return super().decide(view, now)
'''
BROKEN_SOURCE = POLICY_SOURCE.replace("from scheduling", "import os\nfrom scheduling")


def worker(wid: str, used: int, running: int, waiting: int, hits: int,
           status: str = "healthy") -> dict[str, Any]:
    return {"id": wid, "engine": "sim", "model": "sim-llama3-8b", "status": status,
            "kv_capacity_tokens": 65536, "block_size": 16, "max_batch": 64, "pid": 4242,
            "host": "node-a", "inflight": running, "last_seen_s_ago": 0.2,
            "stats": {"kv_capacity_tokens": 65536, "kv_used_tokens": used, "running": running,
                      "waiting": waiting, "prefix_cache_queries": 10000,
                      "prefix_cache_hits": hits, "preemptions": 3, "steps": 900,
                      "generated_tokens": 6700}}


def prog(pid: str, sid: str, status: str, worker_id: str | None, tokens: int, steps: int,
         since: float, reason: str = "", held: bool = False) -> dict[str, Any]:
    return {"id": pid, "session_id": sid, "status": status, "worker_id": worker_id,
            "context_tokens": tokens, "steps": steps, "pinned": False, "held": held,
            "status_reason": reason, "created_at": NOW - 300 + steps,
            "status_since": NOW - since, "stopped_at": None, "active_request": None}


WORKERS = [worker("local-sim-0", 52000, 6, 2, 8100), worker("local-sim-1", 9000, 2, 0, 4300),
           worker("local-sim-2", 0, 0, 0, 0, status="unhealthy")]
PROGRAMS = [
    prog("swe-7", "sess-a", "REASONING", "local-sim-0", 18230, 14, 2.5, "request dispatched"),
    prog("swe-6", "sess-a", "ACTING", "local-sim-0", 15410, 11, 8.0, "request ended"),
    prog("swe-5", "sess-b", "PAUSED", "local-sim-1", 22008, 19, 31.0,
         "thrashing: paused shortest-first"),
    prog("analyst-2", "sess-c", "ACTING", "local-sim-1", 4096, 3, 1.2, "request ended",
         held=True),
    prog("swe-4", "sess-b", "QUEUED", None, 900, 0, 0.4, "waiting for admission"),
    prog("analyst-1", "sess-c", "STOPPED", "local-sim-1", 3012, 5, 95.0, "released"),
]
SESSIONS: list[dict[str, Any]] = [{"id": sid, "tenant": tenant, "priority": prio, "slo_class": slo,
             "pinned_worker": pin, "programs": n, "created_at": NOW - age,
             "updated_at": NOW - age / 3, "state": {}}
            for sid, tenant, prio, slo, pin, n, age in (
                ("sess-a", "acme", 1, "interactive", None, 2, 320.0),
                ("sess-b", "acme", 0, "batch", "local-sim-1", 2, 900.0),
                ("sess-c", "globex", 2, "interactive", None, 2, 4000.0))]
TOOLS = [
    {"backend": "process", "resource": "dir", "id": "/t/swe-6-shell", "name": "swe-6-shell-1a2b",
     "program_id": "swe-6", "tool": "shell", "state": "running", "created_at": NOW - 40,
     "disk_bytes": 3_500_000, "age_s": 40.0},
    {"backend": "process", "resource": "dir", "id": "/t/swe-5-shell", "name": "swe-5-shell-3c4d",
     "program_id": "swe-5", "tool": "shell", "state": "idle", "created_at": NOW - 200,
     "disk_bytes": 81_920, "age_s": 200.0},
    {"backend": "process", "resource": "dir", "id": "/t/old-shell", "name": "old-9-shell-5e6f",
     "program_id": "old-9", "tool": "shell", "state": "idle", "created_at": NOW - 7300,
     "disk_bytes": 1_200_000_000, "age_s": 7300.0},
    {"backend": "docker", "resource": "error",
     "error": {"message": "docker engine unreachable"}},
]


def version(name: str, v: int, status: str, ok: bool, age: float,
            errors: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"name": name, "version": v, "status": status, "author": "ops" if v > 1 else "builtin",
            "created_at": NOW - age, "validation": {
                "ok": ok, "errors": errors or [], "timings_ms": {"decide": 0.02} if ok else {},
                "budget_ms": 5.0, "max_ms": 0.02 if ok else 0.0}}


POLICY_LIST = [{"name": n, "layer": "kv", "active_version": av, "active": av is not None,
                "versions": vs, "created_at": NOW - 5000}
               for n, av, vs in (("agentd", 1, 1), ("canary", None, 3), ("sticky", None, 1))]
CANARY_VERSIONS = [
    version("canary", 1, "draft", True, 3000),
    version("canary", 2, "rolled_back", True, 900),
    version("canary", 3, "draft", False, 60,
            [{"line": 3, "message": "import of 'os' is not allowed"}]),
]
ROLLBACK = {"id": 90, "ts": NOW - 120, "kind": "policy.rolled_back", "data": {
    "layer": "kv", "name": "canary", "version": 2, "restored": "agentd", "restored_version": 1,
    "reason": "RuntimeError: boom in decide()", "automatic": True}}
POLICY_EVENTS = [
    {"id": 80, "ts": NOW - 880, "kind": "policy.activated",
     "data": {"name": "canary", "version": 2, "by": "ops"}},
    ROLLBACK,
]


def trace_events() -> list[dict[str, Any]]:
    def ev(kind: str, t: float, pid: str, rid: str | None = None, wid: str | None = None,
           **data: Any) -> dict[str, Any]:
        return {"id": 0, "ts": NOW - 30 + t, "kind": kind, "session_id": "sess-a",
                "program_id": pid, "request_id": rid, "worker_id": wid, "data": data}

    out = [ev("program.created", 0, "swe-6")]
    for n, (start, wait, prefill, decode) in enumerate(((0.0, 0.1, 0.6, 2.2),
                                                        (6.0, 0.9, 0.3, 1.8))):
        rid = f"req-6{n}aa00bb11cc"
        out += [ev("request.queued", start, "swe-6", rid),
                ev("request.dispatched", start + wait, "swe-6", rid, "local-sim-0"),
                ev("program.status", start + wait, "swe-6", old="ACTING" if n else "QUEUED",
                   new="REASONING", reason="request dispatched"),
                ev("request.first_token", start + wait + prefill, "swe-6", rid, "local-sim-0"),
                ev("request.finished", start + wait + prefill + decode, "swe-6", rid,
                   "local-sim-0", prompt_tokens=1800 + 900 * n, cached_tokens=1500 * n,
                   output_tokens=240, reason="stop"),
                ev("program.status", start + wait + prefill + decode, "swe-6",
                   old="REASONING", new="ACTING", reason="request ended")]
    out.insert(1, ev("kv.admit", 0.1, "swe-6", wid="local-sim-0", reason="routed",
                     policy="agentd"))
    out += [ev("tool.exec.start", 3.2, "swe-6", tool="shell", exec_id=1),
            ev("tool.prepare.start", 3.2, "swe-6", tool="shell"),
            ev("tool.prepare.end", 3.6, "swe-6", tool="shell", ok=True, duration_s=0.4),
            ev("tool.exec.end", 5.7, "swe-6", tool="shell", exec_id=1, ok=True, exit_code=0,
               duration_s=2.1),
            ev("program.created", 12.0, "swe-7"),
            ev("request.queued", 12.0, "swe-7", "req-7aa00bb11cc"),
            ev("request.dispatched", 12.4, "swe-7", "req-7aa00bb11cc", "local-sim-0"),
            ev("program.status", 12.4, "swe-7", old="QUEUED", new="REASONING"),
            ev("request.first_token", 13.0, "swe-7", "req-7aa00bb11cc", "local-sim-0"),
            ev("program.status", 16.0, "swe-7", old="REASONING", new="PAUSED",
               reason="thrashing"),
            ev("kv.pause", 16.0, "swe-7", wid="local-sim-0", reason="thrashing",
               policy="agentd"),
            ev("request.requeued", 16.0, "swe-7", "req-7aa00bb11cc", "local-sim-0"),
            ev("program.migrated", 21.0, "swe-7", "local-sim-1", source="local-sim-0",
               target="local-sim-1", by="operator", recompute_tokens=2048),
            ev("program.status", 22.0, "swe-7", old="PAUSED", new="REASONING"),
            ev("request.dispatched", 22.0, "swe-7", "req-7aa00bb11cc", "local-sim-1"),
            ev("kv.restore", 22.0, "swe-7", wid="local-sim-1", reason="room",
               policy="agentd")]
    return [e | {"id": n} for n, e in enumerate(sorted(out, key=lambda e: e["ts"]), start=1)]


def with_source(v: dict[str, Any], request: httpx.Request) -> dict[str, Any]:
    return v | {"source": BROKEN_SOURCE if v["version"] == 3 else POLICY_SOURCE}


def metrics_text(generated: float, good: float) -> str:
    return ("# TYPE vllm:generation_tokens_total counter\n"
            f'vllm:generation_tokens_total{{model_name="m",worker="w0"}} {generated}\n'
            f"# TYPE agentd_requests_total counter\nagentd_requests_total {good + 3}\n")


def scheduling(met: float) -> dict[str, Any]:
    """GET /v1/scheduling: the counters and the long window the overview's goodput reads."""
    return {"counters": {"completed": met + 3, "met": met},
            "window": {"seconds": 60.0, "completions": 58, "goodput_rps": 0.92,
                       "slo_attainment": 0.95, "ttft_compliance": 0.97,
                       "tpot_compliance": 0.98, "esg_ratio": 0.9, "output_len_cv": 0.4}}


class FixedDaemon:
    """The fixed dataset behind an httpx transport; its clock moves with the metrics script."""

    def __init__(self, down: bool = False) -> None:
        self.down = down
        self.now = NOW - len(RATES)
        self.metrics_calls = 0
        self.routes: dict[tuple[str, str], Callable[[httpx.Request], Any]] = {
            ("GET", "/healthz"): lambda r: {"status": "ok", "workers_healthy": 2, "workers": 3,
                                            "queued": 4, "store_error": None},
            ("GET", "/v1/workers"): lambda r: {"data": WORKERS},
            ("GET", "/v1/programs"): lambda r: {"data": PROGRAMS, "total": 40},
            ("GET", "/v1/policies"): lambda r: {"data": POLICY_LIST},
            ("GET", "/v1/tools"): lambda r: {"data": TOOLS},
            ("GET", "/v1/sessions"): lambda r: {"data": SESSIONS, "total": 3},
            ("GET", "/v1/scheduling"): lambda r: scheduling(RATES[self.step()][1]),
            ("GET", "/v1/sessions/sess-a/trace"): lambda r: {
                "data": [e for e in trace_events() if e["id"] > int(r.url.params["after"])],
                "next_after": None},
            ("GET", "/v1/policies/agentd"): lambda r: self.policy("agentd"),
            ("GET", "/v1/policies/canary"): lambda r: self.policy("canary"),
            ("GET", "/v1/policies/canary/diff"): lambda r: {
                "name": "canary", "from": 2, "to": 3, "diff": (
                    "--- canary v2\n+++ canary v3\n@@ -1,3 +1,4 @@\n \"\"\"Canary...\"\"\"\n"
                    " \n+import os\n from scheduling.kv.baselines import StickyPolicy\n")},
            ("PUT", "/v1/policies/canary"): lambda r: CANARY_VERSIONS[2] | {"version": 4},
        }
        self.routes[("GET", "/v1/policies/agentd/versions/1")] = lambda r: version(
            "agentd", 1, "active", True, 5000) | {"source": POLICY_SOURCE}
        for v in CANARY_VERSIONS:
            self.routes[("GET", f"/v1/policies/canary/versions/{v['version']}")] = partial(
                with_source, v)

    def clock(self) -> float:
        return self.now

    def policy(self, name: str) -> dict[str, Any]:
        canary = name == "canary"
        versions = CANARY_VERSIONS if canary else [version("agentd", 1, "active", True, 5000)]
        return {**next(p for p in POLICY_LIST if p["name"] == name), "versions": versions,
                "status": versions[-1]["status"], "source_version": versions[-1]["version"],
                "source": BROKEN_SOURCE if canary else POLICY_SOURCE,
                "events": POLICY_EVENTS if canary else [ROLLBACK]}

    def step(self) -> int:
        return max(min(self.metrics_calls, len(RATES)) - 1, 0)

    def metrics(self) -> str:
        self.metrics_calls += 1
        if self.metrics_calls <= len(RATES):
            self.now = NOW - len(RATES) + self.metrics_calls
        return metrics_text(*RATES[self.step()])

    def handle(self, request: httpx.Request) -> httpx.Response:
        if self.down:
            raise httpx.ConnectError("connection refused", request=request)
        if request.url.path == "/metrics":
            return httpx.Response(200, text=self.metrics())
        route = self.routes.get((request.method, request.url.path))
        if route is None:
            return httpx.Response(404, json={"error": {"message": "not in the dataset"}})
        return httpx.Response(200, content=json.dumps(route(request)).encode(),
                              headers={"content-type": "application/json"})


def fixed_app(daemon: FixedDaemon) -> AgentdTui:
    client = AsyncAgentdClient(URL, "fixed-token", 2.0,
                               transport=httpx.MockTransport(daemon.handle))
    return AgentdTui(client, poll_interval=0.02, clock=daemon.clock, ttft_slo_s=1.0)


def shoot(snap_compare: Any, steps: Callable[[Pilot[None], FixedDaemon], Awaitable[None]],
          daemon: FixedDaemon | None = None) -> bool:
    daemon = daemon or FixedDaemon()

    async def run_before(pilot: Pilot[None]) -> None:
        await steps(pilot, daemon)
        app = pilot.app
        assert isinstance(app, AgentdTui)
        app.poll_interval = 3600  # the data is all there; let the app go idle for the shot
        await pilot.pause(0.1)
        for area in pilot.app.screen.query(TextArea):
            area.cursor_blink = False  # a blinking cursor would make the picture flaky

    return bool(snap_compare(fixed_app(daemon), terminal_size=SIZE, run_before=run_before))


async def settled(pilot: Pilot[None], daemon: FixedDaemon,
                  ready: Callable[[], bool] = lambda: True) -> None:
    """Wait until the metrics script is played out and the view has what it shows."""
    await until(pilot, lambda: daemon.metrics_calls > LAST_METRICS_CALL and ready(),
                "the fixed dataset to settle", timeout=8, interval=0.02)


def rows(pilot: Pilot[None]) -> int:
    return sum(t.row_count for t in pilot.app.screen.query(KeyedTable))


def shown_version(pilot: Pilot[None]) -> int | None:
    version = getattr(pilot.app.screen, "version", None) or {}
    return version.get("version")


def test_overview(snap_compare: Any) -> None:
    async def steps(pilot: Pilot[None], d: FixedDaemon) -> None:
        app = pilot.app
        assert isinstance(app, AgentdTui)
        await settled(pilot, d, lambda: len(app.rates.throughput) == len(RATES) - 1)

    assert shoot(snap_compare, steps)


def test_programs(snap_compare: Any) -> None:
    async def steps(pilot: Pilot[None], d: FixedDaemon) -> None:
        await pilot.press("2")
        await settled(pilot, d, lambda: rows(pilot) == len(PROGRAMS))

    assert shoot(snap_compare, steps)


def test_programs_sorted_and_filtered(snap_compare: Any) -> None:
    async def steps(pilot: Pilot[None], d: FixedDaemon) -> None:
        await pilot.press("2", "s", "s", "slash", *"swe", "enter")
        await settled(pilot, d, lambda: rows(pilot) == 4)

    assert shoot(snap_compare, steps)


def test_sessions(snap_compare: Any) -> None:
    async def steps(pilot: Pilot[None], d: FixedDaemon) -> None:
        await pilot.press("3")
        await settled(pilot, d, lambda: rows(pilot) == len(SESSIONS))

    assert shoot(snap_compare, steps)


def test_session_trace_with_details(snap_compare: Any) -> None:
    async def steps(pilot: Pilot[None], d: FixedDaemon) -> None:
        await pilot.press("3")
        await settled(pilot, d, lambda: rows(pilot) == len(SESSIONS))
        await pilot.press("enter")
        screen = pilot.app.screen
        assert isinstance(screen, TraceScreen)
        await settled(pilot, d, lambda: len(screen.events) == len(trace_events()))
        await pilot.press("home", "down", "enter")

    assert shoot(snap_compare, steps)


def test_policies_with_a_failed_version(snap_compare: Any) -> None:
    async def steps(pilot: Pilot[None], d: FixedDaemon) -> None:
        await pilot.press("4")
        await settled(pilot, d, lambda: rows(pilot) > 0)
        await pilot.press("down")
        await settled(pilot, d, lambda: shown_version(pilot) == 3)

    assert shoot(snap_compare, steps)


def test_policy_diff(snap_compare: Any) -> None:
    async def steps(pilot: Pilot[None], d: FixedDaemon) -> None:
        await pilot.press("4")
        await settled(pilot, d, lambda: rows(pilot) > 0)
        await pilot.press("down")
        await settled(pilot, d, lambda: shown_version(pilot) == 3)
        await pilot.press("d")
        await settled(pilot, d, lambda: pilot.app.screen.query_one(PolicyPane).showing_diff)

    assert shoot(snap_compare, steps)


def test_policy_editor_with_inline_report(snap_compare: Any) -> None:
    async def steps(pilot: Pilot[None], d: FixedDaemon) -> None:
        await pilot.press("4")
        await settled(pilot, d, lambda: rows(pilot) > 0)
        await pilot.press("down")
        await settled(pilot, d, lambda: shown_version(pilot) == 3)
        await pilot.press("e", "ctrl+s")
        editor = pilot.app.screen
        assert isinstance(editor, PolicyEditorScreen)
        await settled(pilot, d, lambda: editor.stored is not None)

    assert shoot(snap_compare, steps)


def test_tools(snap_compare: Any) -> None:
    async def steps(pilot: Pilot[None], d: FixedDaemon) -> None:
        await pilot.press("5")
        await settled(pilot, d, lambda: rows(pilot) == 3)

    assert shoot(snap_compare, steps)


def test_help(snap_compare: Any) -> None:
    async def steps(pilot: Pilot[None], d: FixedDaemon) -> None:
        await pilot.press("2")
        await settled(pilot, d, lambda: rows(pilot) == len(PROGRAMS))
        await pilot.press("question_mark")

    assert shoot(snap_compare, steps)


def test_error_bar_when_the_daemon_is_down(snap_compare: Any) -> None:
    async def steps(pilot: Pilot[None], d: FixedDaemon) -> None:
        app = pilot.app
        assert isinstance(app, AgentdTui)
        await until(pilot, lambda: bool(app.error), "the error to show", timeout=2, interval=0.02)

    assert shoot(snap_compare, steps, FixedDaemon(down=True))
