"""Two tenants against one real daemon: every route the app serves is walked with tenant
A's tokens naming tenant B's objects, and each must refuse (404 as for an unknown id, or
403 where the route needs a scope A lacks) or show A nothing of B's. A route missing from
the table fails the walk, so a new endpoint cannot skip the tenancy rule."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from daemon.access import auth
from daemon.app import create_app
from daemon.config import Config
from tests.daemon_process import DaemonProcess
from tests.store_fixtures import DATABASES, module_db
from tests.ui.webui_support import csrf_of, login
from tests.waiting import wait_for

MODEL = "sim-llama3-8b"
# What only tenant B put in: none of it may reach tenant A in any answer.
ARG_SECRET = f"arg-{uuid.uuid4().hex}"  # B's run argument, then B's managed state
RESULT_SECRET = f"result-{uuid.uuid4().hex}"
RESPONSE_SECRET = f"instructions-{uuid.uuid4().hex}"  # B's stored response's instructions
CONTENT_SECRET = f"prompt-{uuid.uuid4().hex}"  # B's prompt, stored by content tracing
B_SESSION, B_PROGRAM, B_IDLE = "b-sess", "b-prog", "b-idle"
B_SNAPSHOT, B_SNAPSHOT_IDS = "b-snap", [7, 7, 7]  # a context snapshot: names are per tenant

STORE = f'''import agentd


def main(secret: str) -> str:
    vault = agentd.ManagedDict("vault")
    vault["secret"] = secret
    return "{RESULT_SECRET}"
'''
# Tenant A's workflow of the same name: it would read and overwrite B's state if it ran
# in B's session.
THIEF = '''import agentd


def main(secret: str) -> str:
    vault = agentd.ManagedDict("vault")
    stolen = vault.get("secret", "")
    vault["secret"] = "overwritten by A"
    return "A:" + stolen
'''


@dataclass
class World:
    d: DaemonProcess
    a: str  # tenant a: read, submit
    b: str  # tenant b: read, submit
    b_run: str
    b_response: str
    b_request: str  # B_PROGRAM's first request
    a_ui: httpx.Client


def _token(d: DaemonProcess, tenant: str) -> str:
    done = d.cli("token", "create", "--scope", "read,submit", "--name", tenant,
                 "--tenant", tenant)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def _req(d: DaemonProcess, token: str, method: str, path: str, **kw: Any) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}", **kw.pop("headers", {})}
    return httpx.request(method, f"{d.url}{path}", headers=headers, timeout=30, **kw)


def _chat(d: DaemonProcess, token: str, **extra: Any) -> httpx.Response:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    return _req(d, token, "POST", "/v1/chat/completions", json=body | extra.pop("json", {}),
                **extra)


def _run(d: DaemonProcess, token: str, body: dict[str, Any]) -> dict[str, Any]:
    r = _req(d, token, "POST", "/v1/runs", json=body)
    assert r.status_code == 201, r.text
    run_id = r.json()["id"]
    return dict(wait_for(lambda: (v := _req(d, token, "GET", f"/v1/runs/{run_id}").json())
                         ["status"] in ("finished", "failed", "cancelled") and v,
                         60, f"run {run_id} to end"))


@pytest.fixture(scope="module", params=DATABASES)
def world(request: pytest.FixtureRequest,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    """Tenants A and B on a daemon on each store: SQLite, and a PostgreSQL database."""
    with module_db(request) as db:
        yield from _world(tmp_path_factory, db)


def _world(tmp_path_factory: pytest.TempPathFactory, db: str) -> Iterator[World]:
    d = DaemonProcess(tmp_path_factory.mktemp("tenants") / "data", db=db,
                      env={"AGENTD_CONTENT_TRACING": "true"}).start()
    try:
        a, b = _token(d, "a"), _token(d, "b")
        files = {"main.py": STORE}
        r = _req(d, b, "POST", "/v1/workflows",
                 json={"name": "b_store", "files": files, "entry": "main:main"})
        assert r.status_code == 201, r.text
        run = _run(d, b, {"workflow": "b_store", "session_id": B_SESSION,
                          "args": {"secret": ARG_SECRET}})
        assert run["status"] == "finished" and run["result"] == RESULT_SECRET, run
        # B's program stays live (never released); an idle one for the release check.
        for program in (B_PROGRAM, B_IDLE):
            r = _chat(d, b, json={"program_id": program, "session_id": B_SESSION,
                                  "messages": [{"role": "user", "content": CONTENT_SECRET}]})
            assert r.status_code == 200, r.text
        r = _req(d, b, "PUT", f"/v1/contexts/snapshots/{B_SNAPSHOT}",
                 json={"model": MODEL, "token_ids": B_SNAPSHOT_IDS})
        assert r.status_code == 200, r.text
        r = _req(d, b, "POST", "/v1/responses", json={
            "model": MODEL, "input": "x", "instructions": RESPONSE_SECRET,
            "max_output_tokens": 2})
        assert r.status_code == 200, r.text
        b_request = d.get(f"/v1/programs/{B_PROGRAM}").json()["requests"][0]["id"]
        yield World(d, a, b, run["id"], r.json()["id"], b_request, login(d, a))
    finally:
        d.stop()


# --- the walk -----------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    """A's request on one route, naming B's objects where the route takes one."""

    path: str  # the concrete path (B's ids filled in)
    expect: int | tuple[int, ...]  # A's status
    body: dict[str, Any] | None = None
    headers: dict[str, str] | None = None
    ui: bool = False  # through A's logged-in web UI session instead of a bearer token


NOT_FOUND, FORBIDDEN, OK = 404, 403, 200
RUN = "{run}"  # replaced by B's run id
RESPONSE = "{response}"  # replaced by B's stored response's id
REQUEST = "{request}"  # replaced by B's request's id
SPEC = {"name": "x", "version": 1}

# Every route the app serves: (method, template) -> A's case.
CASES: dict[tuple[str, str], Case] = {
    ("POST", "/v1/chat/completions"): Case("/v1/chat/completions", NOT_FOUND, {
        "model": MODEL, "messages": [{"role": "user", "content": "x"}],
        "program_id": B_PROGRAM}),
    ("POST", "/v1/completions"): Case("/v1/completions", NOT_FOUND, {
        "model": MODEL, "prompt": "x", "session_id": B_SESSION}),
    ("GET", "/v1/models"): Case("/v1/models", OK),
    ("POST", "/v1/contexts/generate"): Case("/v1/contexts/generate", NOT_FOUND, {
        "model": MODEL, "token_ids": [1], "program_id": B_PROGRAM}),
    ("POST", "/v1/contexts/idle"): Case("/v1/contexts/idle", NOT_FOUND, {
        "program_id": B_PROGRAM, "state": "start"}),
    ("POST", "/v1/contexts/pin"): Case("/v1/contexts/pin", NOT_FOUND, {
        "program_id": B_PROGRAM, "pinned": True}),
    ("POST", "/v1/contexts/fork"): Case("/v1/contexts/fork", NOT_FOUND, {
        "program_id": B_PROGRAM, "tokens": 1, "n": 2}),
    ("POST", "/v1/contexts/drop"): Case("/v1/contexts/drop", NOT_FOUND, {
        "program_id": B_PROGRAM, "tokens": 1}),
    ("GET", "/v1/contexts/snapshots/{name:str}"): Case(f"/v1/contexts/snapshots/{B_SNAPSHOT}",
                                                       NOT_FOUND),
    ("DELETE", "/v1/contexts/snapshots/{name:str}"): Case(
        f"/v1/contexts/snapshots/{B_SNAPSHOT}", NOT_FOUND),
    # A's own snapshot of the same name (walked after A's GET and DELETE found none).
    ("PUT", "/v1/contexts/snapshots/{name:str}"): Case(f"/v1/contexts/snapshots/{B_SNAPSHOT}",
                                                       OK, {"model": MODEL, "token_ids": [1]}),
    ("POST", "/v1/responses"): Case("/v1/responses", NOT_FOUND, {
        "model": MODEL, "input": "x", "previous_response_id": RESPONSE}),
    ("GET", "/v1/responses/{response_id:str}"): Case(f"/v1/responses/{RESPONSE}", NOT_FOUND),
    ("DELETE", "/v1/responses/{response_id:str}"): Case(f"/v1/responses/{RESPONSE}",
                                                         NOT_FOUND),
    ("GET", "/v1/programs/{program_id:str}"): Case(f"/v1/programs/{B_PROGRAM}", NOT_FOUND),
    ("GET", "/v1/programs"): Case("/v1/programs", OK),
    ("POST", "/v1/programs/{program_id:str}/release"): Case(
        f"/v1/programs/{B_IDLE}/release", NOT_FOUND),
    # A's own idle programs only: naming B is refused (B's stay live for the other cases).
    ("POST", "/v1/programs/release-idle"): Case("/v1/programs/release-idle", FORBIDDEN,
                                                {"idle_s": 0, "tenant": "b"}),
    ("GET", "/v1/sessions/{session_id:str}"): Case(f"/v1/sessions/{B_SESSION}", NOT_FOUND),
    ("GET", "/v1/sessions"): Case("/v1/sessions?tenant=b", OK),
    ("GET", "/v1/sessions/{session_id:str}/trace"): Case(f"/v1/sessions/{B_SESSION}/trace",
                                                         NOT_FOUND),
    ("GET", "/v1/sessions/{session_id:str}/export"): Case(
        f"/v1/sessions/{B_SESSION}/export?format=perfetto", NOT_FOUND),
    ("GET", "/v1/sessions/{session_id:str}/contents"): Case(
        f"/v1/sessions/{B_SESSION}/contents", NOT_FOUND),
    ("POST", "/v1/sessions/{session_id:str}/export/otlp"): Case(
        f"/v1/sessions/{B_SESSION}/export/otlp", NOT_FOUND, {}),
    # A's own tenant's totals only (the lists test: no line of B's)
    ("GET", "/v1/usage"): Case("/v1/usage", OK),
    ("GET", "/v1/workers"): Case("/v1/workers", OK),
    ("GET", "/v1/workers/{worker_id:str}"): Case("/v1/workers/local-sim-0", OK),
    ("GET", "/v1/requests/{request_id:str}"): Case(f"/v1/requests/{REQUEST}", NOT_FOUND),
    ("GET", "/v1/whoami"): Case("/v1/whoami", OK),
    # cluster-wide series and events of no tenant or A's own (daemon/api/history_api.py);
    # tests/integration/test_history_daemon.py shows B's events stay B's
    ("GET", "/v1/history"): Case("/v1/history", OK),
    ("GET", "/v1/events"): Case("/v1/events", OK),
    ("POST", "/v1/programs/{program_id:str}/kill"): Case(f"/v1/programs/{B_PROGRAM}/kill",
                                                         FORBIDDEN, {}),
    ("POST", "/v1/programs/{program_id:str}/migrate"): Case(
        f"/v1/programs/{B_PROGRAM}/migrate", FORBIDDEN, {"worker_id": "local-sim-0"}),
    ("POST", "/v1/sessions/{session_id:str}/migrate"): Case(
        f"/v1/sessions/{B_SESSION}/migrate", FORBIDDEN, {"worker_id": "local-sim-0"}),
    ("POST", "/v1/programs/{program_id:str}/pause"): Case(f"/v1/programs/{B_PROGRAM}/pause",
                                                          FORBIDDEN, {}),
    ("POST", "/v1/programs/{program_id:str}/resume"): Case(
        f"/v1/programs/{B_PROGRAM}/resume", FORBIDDEN, {}),
    ("GET", "/healthz"): Case("/healthz", OK),
    ("GET", "/metrics"): Case("/metrics", OK),
    ("POST", "/v1/programs/{program_id:str}/tools"): Case(f"/v1/programs/{B_PROGRAM}/tools",
                                                          NOT_FOUND, {"tools": ["shell"]}),
    ("GET", "/v1/programs/{program_id:str}/tools"): Case(f"/v1/programs/{B_PROGRAM}/tools",
                                                         NOT_FOUND),
    ("POST", "/v1/programs/{program_id:str}/tools/{tool:str}/exec"): Case(
        f"/v1/programs/{B_PROGRAM}/tools/shell/exec", NOT_FOUND, {"command": "true"}),
    ("POST", "/v1/tools/gc"): Case("/v1/tools/gc", FORBIDDEN, {}),
    ("GET", "/v1/tools"): Case(f"/v1/tools?program_id={B_PROGRAM}", NOT_FOUND),
    ("GET", "/v1/scheduling"): Case("/v1/scheduling", OK),
    ("GET", "/v1/scheduling/trace"): Case("/v1/scheduling/trace", OK),
    ("POST", "/v1/admin/drain"): Case("/v1/admin/drain", FORBIDDEN, {}),
    ("GET", "/v1/policies"): Case("/v1/policies", OK),
    ("GET", "/v1/policies/{name:str}"): Case("/v1/policies/fcfs", (OK, NOT_FOUND)),
    ("GET", "/v1/policies/{name:str}/versions"): Case("/v1/policies/fcfs/versions",
                                                      (OK, NOT_FOUND)),
    ("GET", "/v1/policies/{name:str}/versions/{version:int}"): Case(
        "/v1/policies/fcfs/versions/1", (OK, NOT_FOUND)),
    ("GET", "/v1/policies/{name:str}/diff"): Case("/v1/policies/fcfs/diff?a=1&b=1",
                                                  (OK, NOT_FOUND, 400)),
    ("PUT", "/v1/policies/{name:str}"): Case("/v1/policies/x", FORBIDDEN, {}),
    ("POST", "/v1/policies/{name:str}/validate"): Case("/v1/policies/x/validate", FORBIDDEN, {}),
    ("POST", "/v1/policies/{name:str}/activate"): Case("/v1/policies/x/activate", FORBIDDEN, {}),
    ("POST", "/v1/policies/{name:str}/rollback"): Case("/v1/policies/x/rollback", FORBIDDEN, {}),
    ("GET", "/v1/workflows"): Case("/v1/workflows", OK),
    ("POST", "/v1/workflows"): Case("/v1/workflows", 201, {
        "name": "b_store", "files": {"main.py": THIEF}, "entry": "main:main"}),
    ("GET", "/v1/runs"): Case("/v1/runs", OK),
    ("POST", "/v1/runs"): Case("/v1/runs", NOT_FOUND, {
        "workflow": "b_store", "session_id": B_SESSION, "args": {"secret": "x"}}),
    ("GET", "/v1/runs/{run_id:str}"): Case(f"/v1/runs/{RUN}", NOT_FOUND),
    ("DELETE", "/v1/runs/{run_id:str}"): Case(f"/v1/runs/{RUN}", NOT_FOUND),
    ("GET", "/v1/runs/{run_id:str}/events"): Case(f"/v1/runs/{RUN}/events", NOT_FOUND),
    ("POST", "/v1/runs/{run_id:str}/events"): Case(f"/v1/runs/{RUN}/events", NOT_FOUND,
                                                   {"events": []}),
    ("GET", "/v1/runs/{run_id:str}/state"): Case(f"/v1/runs/{RUN}/state", NOT_FOUND),
    ("PUT", "/v1/runs/{run_id:str}/state/{name:str}"): Case(f"/v1/runs/{RUN}/state/vault",
                                                            NOT_FOUND, {"value": {}}),
    ("POST", "/v1/runs/{run_id:str}/control"): Case(f"/v1/runs/{RUN}/control", NOT_FOUND,
                                                    {"view": {}}),
    ("GET", "/v1/runs/{run_id:str}/control"): Case(f"/v1/runs/{RUN}/control", NOT_FOUND),
    ("POST", "/v1/runs/{run_id:str}/control/decisions"): Case(
        f"/v1/runs/{RUN}/control/decisions", FORBIDDEN, {"decisions": []}),
    ("GET", "/v1/control"): Case("/v1/control", OK),
    ("PUT", "/v1/control/policy"): Case("/v1/control/policy", FORBIDDEN, {"name": "x"}),
    # The web UI calls the same API with the logged-in token: pages naming B's objects
    # show an error or nothing of B's; actions on them fail.
    ("GET", "/ui/login"): Case("/ui/login", OK, ui=True),
    ("POST", "/ui/login"): Case("/ui/login", (OK, 303, 401, 403), {"token": "x"}, ui=True),
    ("POST", "/ui/logout"): Case("/ui/logout", (303, 403), {}, ui=True),
    ("GET", "/ui"): Case("/ui/", OK, ui=True),
    ("GET", "/ui/events"): Case("/ui/events", OK, ui=True),
    ("GET", "/ui/programs"): Case(f"/ui/programs?session={B_SESSION}", OK, ui=True),
    ("GET", "/ui/programs/live"): Case("/ui/programs/live", OK, ui=True),
    ("GET", "/ui/sessions"): Case("/ui/sessions?tenant=b", OK, ui=True),
    ("GET", "/ui/session"): Case(f"/ui/session?id={B_SESSION}", NOT_FOUND, ui=True),
    ("GET", "/ui/program"): Case(f"/ui/program?id={B_PROGRAM}", NOT_FOUND, ui=True),
    ("GET", "/ui/request"): Case(f"/ui/request?id={REQUEST}", NOT_FOUND, ui=True),
    ("GET", "/ui/session/export"): Case(f"/ui/session/export?id={B_SESSION}", NOT_FOUND,
                                        ui=True),
    ("GET", "/ui/worker"): Case("/ui/worker?id=local-sim-0", OK, ui=True),
    ("POST", "/ui/actions/program"): Case("/ui/actions/program", 303,
                                          {"id": B_PROGRAM, "action": "kill"}, ui=True),
    ("POST", "/ui/actions/session"): Case("/ui/actions/session", 303,
                                          {"id": B_SESSION, "worker_id": "local-sim-0"},
                                          ui=True),
    # the bulk release's confirmation lists A's own idle programs only (see the lists test)
    ("GET", "/ui/release-idle"): Case("/ui/release-idle?idle_s=0", OK, ui=True),
    ("POST", "/ui/actions/release-idle"): Case("/ui/actions/release-idle", 303,
                                               {"idle_s": "86400"}, ui=True),
    ("GET", "/ui/policies"): Case("/ui/policies", OK, ui=True),
    ("GET", "/ui/policy"): Case("/ui/policy?name=fcfs", (OK, NOT_FOUND), ui=True),
    ("GET", "/ui/policy/diff"): Case("/ui/policy/diff?name=fcfs&a=1&b=1",
                                     (OK, 400, NOT_FOUND), ui=True),
    ("POST", "/ui/actions/policy"): Case("/ui/actions/policy", 303, {"name": "x"}, ui=True),
    ("GET", "/ui/tools"): Case("/ui/tools", OK, ui=True),
    ("POST", "/ui/actions/tools/reclaim"): Case("/ui/actions/tools/reclaim", 303, {}, ui=True),
    ("GET", "/ui/workflows"): Case("/ui/workflows", OK, ui=True),
    # The OpenAPI document as a page and as a download: the same for every tenant.
    ("GET", "/ui/api"): Case("/ui/api", OK, ui=True),
    ("GET", "/ui/api/openapi.json"): Case("/ui/api/openapi.json", OK, ui=True),
    ("POST", "/ui/actions/run"): Case("/ui/actions/run", 303,
                                      {"workflow": "b_store", "session_id": B_SESSION,
                                       "args": '{"secret": "x"}'}, ui=True),
    ("GET", "/ui/run"): Case(f"/ui/run?id={RUN}", NOT_FOUND, ui=True),
    ("GET", "/ui/run/events"): Case(f"/ui/run/events?id={RUN}", (OK, NOT_FOUND), ui=True),
    ("POST", "/ui/actions/run/cancel"): Case("/ui/actions/run/cancel", 303, {"id": RUN},
                                             ui=True),
    ("GET", "/ui/static/{file_path:path}"): Case("/ui/static/app.css", (OK, NOT_FOUND),
                                                 ui=True),
    ("HEAD", "/ui/static/{file_path:path}"): Case("/ui/static/app.css", (OK, NOT_FOUND),
                                                  ui=True),
}
SCHEMA = {"/schema", "/schema/openapi.json", "/schema/openapi.yaml", "/schema/openapi.yml",
          "/schema/redoc", "/schema/rapidoc", "/schema/swagger", "/schema/elements",
          "/schema/oauth2-redirect.html", "/schema/{path:str}"}
CASES |= {("GET", p): Case(p.replace("{path:str}", "openapi.json"), (OK, NOT_FOUND))
          for p in SCHEMA}


def _served() -> set[tuple[str, str]]:
    return {(m, p) for m, p, _ in auth.iter_routes(create_app(Config())) if m != "OPTIONS"}


def test_the_walk_covers_every_route() -> None:
    served = _served()
    assert served - set(CASES) == set(), "routes the two-tenant walk does not cover"
    assert set(CASES) - served == set(), "cases for routes the app no longer serves"


def _secrets_of_b(world: World, case: Case) -> list[str]:
    """B's secrets and, unless A named it (an error may echo it), B's run id."""
    named = RUN in case.path or RUN in str(case.body)
    return [ARG_SECRET, RESULT_SECRET, RESPONSE_SECRET, CONTENT_SECRET] + (
        [] if named else [world.b_run])


def _send(world: World, method: str, case: Case) -> tuple[int, str]:
    """A's (status, text) for the case; a stream is read up to its first chunk."""
    path = case.path.replace(RUN, world.b_run).replace(RESPONSE, world.b_response).replace(
        REQUEST, world.b_request)
    if not case.ui:
        body = {k: world.b_response if v == RESPONSE else v for k, v in case.body.items()} \
            if case.body is not None else None
        r = _req(world.d, world.a, method, path, json=body, headers=case.headers or {})
        return r.status_code, r.text
    c = world.a_ui
    if method == "POST":
        form = {"_csrf": csrf_of(c.get("/ui/").text), "next": "/ui/"}
        fields = {k: v.replace(RUN, world.b_run) for k, v in (case.body or {}).items()}
        r = c.post(path, data=form | fields)
        return r.status_code, r.text
    with c.stream(method, path, timeout=30) as r:
        if r.headers.get("content-type", "").startswith("text/event-stream"):
            return r.status_code, next(r.iter_text(), "")
        return r.status_code, r.read().decode(errors="replace")


@pytest.mark.parametrize("route", sorted(CASES), ids=lambda r: f"{r[0]} {r[1]}")
def test_tenant_a_gets_nothing_of_tenant_b(world: World, route: tuple[str, str]) -> None:
    method, _ = route
    case = CASES[route]
    status, text = _send(world, method, case)
    expected = case.expect if isinstance(case.expect, tuple) else (case.expect,)
    assert status in expected, f"{method} {case.path}: {status} {text[:400]}"
    for secret in _secrets_of_b(world, case):
        assert secret not in text, f"{method} {case.path} shows B's {secret}"
    if status == NOT_FOUND and not case.ui:
        assert '"code":"not_found"' in text.replace(" ", ""), text


def test_lists_show_a_none_of_b(world: World) -> None:
    d, a = world.d, world.a
    programs = _req(d, a, "GET", "/v1/programs").json()["data"]
    assert not {B_PROGRAM, B_IDLE} & {p["id"] for p in programs}
    assert _req(d, a, "GET", "/v1/sessions").json() == {"data": [], "total": 0}
    assert _req(d, a, "GET", "/v1/sessions?tenant=b").json()["total"] == 0
    assert world.b_run not in _req(d, a, "GET", "/v1/runs").text
    tools = _req(d, a, "GET", "/v1/tools").json()
    assert B_PROGRAM not in tools["by_program"]
    # A worker serves every tenant; the requests its page lists are the caller's only.
    worker = d.get(f"/v1/requests/{world.b_request}").json()["worker_id"]
    assert world.b_request in _req(d, world.b, "GET", f"/v1/workers/{worker}").text
    assert world.b_request not in _req(d, a, "GET", f"/v1/workers/{worker}").text
    assert world.b_request not in world.a_ui.get(f"/ui/worker?id={worker}").text
    confirm = world.a_ui.get("/ui/release-idle", params={"idle_s": "0"}).text
    assert B_IDLE not in confirm and B_PROGRAM not in confirm
    # events of B's tenant are B's; A sees its own and the cluster's
    assert all(e["tenant"] in (None, "a")
               for e in _req(d, a, "GET", "/v1/events?limit=1000").json()["data"])
    # content search and usage: nothing of B's (B's prompt is stored: B finds it)
    assert _req(d, a, "GET", "/v1/sessions", params={"q": CONTENT_SECRET}).json()["total"] == 0
    assert B_SESSION in _req(d, world.b, "GET", "/v1/sessions",
                             params={"q": CONTENT_SECRET}).text
    assert CONTENT_SECRET in _req(d, world.b, "GET", f"/v1/requests/{world.b_request}").text
    assert "b" not in {u["tenant"] for u in _req(d, a, "GET", "/v1/usage").json()["data"]}
    # B's own OTLP export passes the tenancy rule and meets the unset endpoint
    r = _req(d, world.b, "POST", f"/v1/sessions/{B_SESSION}/export/otlp")
    assert r.status_code == 409 and r.json()["error"]["param"] == "otlp_endpoint", r.text
    tenants = _req(d, a, "GET", "/v1/scheduling").json()["tenants"]
    assert "b" not in str(tenants), tenants
    # The owner and the operator do see them.
    assert B_SESSION in {s["id"] for s in _req(d, world.b, "GET", "/v1/sessions").json()["data"]}
    assert world.b_run in _req(d, world.b, "GET", "/v1/runs").text
    assert B_SESSION in {s["id"] for s in d.get("/v1/sessions").json()["data"]}


def test_b_is_untouched_after_the_walk(world: World) -> None:
    """Run last in the module: nothing A sent changed B's objects."""
    d, b = world.d, world.b
    assert _req(d, b, "GET", f"/v1/programs/{B_IDLE}").json()["status"] not in (
        "STOPPED", "FAILED")
    assert _req(d, b, "GET", f"/v1/programs/{B_PROGRAM}").json()["status"] not in (
        "STOPPED", "FAILED")
    state = _req(d, b, "GET", f"/v1/sessions/{B_SESSION}").json()["state"]
    assert state["vault"]["secret"] == ARG_SECRET
    assert _req(d, b, "GET", f"/v1/runs/{world.b_run}").json()["status"] == "finished"
    response = _req(d, b, "GET", f"/v1/responses/{world.b_response}").json()
    assert response["instructions"] == RESPONSE_SECRET


def test_workflow_names_are_per_tenant(world: World) -> None:
    """Defect 1: A registering B's workflow name makes A's own; B's runs keep B's code."""
    d, a, b = world.d, world.a, world.b
    mine = _req(d, a, "POST", "/v1/workflows",
                json={"name": "b_store", "files": {"main.py": THIEF}, "entry": "main:main"})
    assert mine.status_code == 201 and mine.json()["tenant"] == "a", mine.text
    b_again = _run(d, b, {"workflow": "b_store", "session_id": "b-sess-2",
                          "args": {"secret": "two"}})
    assert b_again["result"] == RESULT_SECRET, b_again
    a_own = _run(d, a, {"workflow": "b_store", "args": {"secret": "x"}})
    assert a_own["result"] == "A:", a_own
    listed = {(w["tenant"], w["name"]) for w in d.get("/v1/workflows").json()["data"]}
    assert {("a", "b_store"), ("b", "b_store")} <= listed
    assert [w["tenant"] for w in _req(d, a, "GET", "/v1/workflows").json()["data"]] == ["a"]


def test_state_and_programs_do_not_cross(world: World) -> None:
    """Defects 2 and 3 through the gateway's headers and a run's session."""
    d, a = world.d, world.a
    for headers in ({"X-Program-Id": B_PROGRAM}, {"X-Session-Id": B_SESSION}):
        r = _chat(d, a, headers=headers)
        assert r.status_code == NOT_FOUND, r.text
        assert r.json()["error"]["param"] == next(iter(headers)), r.text
    r = _req(d, a, "POST", "/v1/runs", json={"workflow": "b_store", "session_id": B_SESSION,
                                              "args": {"secret": "x"}})
    assert r.status_code == NOT_FOUND and r.json()["error"]["param"] == "session_id", r.text
    r = _req(d, a, "GET", f"/v1/sessions/{B_SESSION}")
    assert r.status_code == NOT_FOUND and ARG_SECRET not in r.text


def test_operator_sees_every_tenant(world: World) -> None:
    d = world.d
    assert d.get(f"/v1/sessions/{B_SESSION}").json()["state"]["vault"]["secret"] == ARG_SECRET
    assert d.get(f"/v1/runs/{world.b_run}").status_code == OK
    assert re.search(r'"tenant":\s*"b"', d.get("/v1/runs").text)


def test_snapshot_names_are_per_tenant(world: World) -> None:
    """A's snapshot of B's name is A's own (the walk's PUT, again here), and B's still
    holds B's ids."""
    path = f"/v1/contexts/snapshots/{B_SNAPSHOT}"
    _req(world.d, world.a, "PUT", path, json={"model": MODEL, "token_ids": [1]})
    assert _req(world.d, world.b, "GET", path).json()["token_ids"] == B_SNAPSHOT_IDS
    assert _req(world.d, world.a, "GET", path).json()["token_ids"] == [1]


def test_a_snapshot_is_not_opened_in_another_tenants_program(world: World) -> None:
    """Opening names a program (the daemon may fill the snapshot as its request): A's own
    snapshot opened in B's program is refused as an unknown program, and B's trace is bare."""
    path = f"/v1/contexts/snapshots/{B_SNAPSHOT}"
    _req(world.d, world.a, "PUT", path, json={"model": MODEL, "token_ids": [1]})
    r = _req(world.d, world.a, "GET", path, params={"program_id": B_PROGRAM})
    assert r.status_code == NOT_FOUND and r.json()["error"]["param"] == "program_id", r.text
    trace = world.d.get(f"/v1/sessions/{B_SESSION}/trace", params={"limit": 5000}).json()
    assert not [e for e in trace["data"] if e["kind"] == "context.open"]
