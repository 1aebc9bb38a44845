"""Content tracing on a real daemon with the sim engine (daemon/content/): a tenant that
turns it on gets each request's prompt, completion and tool arguments stored, redacted and
capped, shown with the request; a tenant that does not gets nothing stored. Token totals
and cost per session, program and tenant; a session's export as JSON and as a Perfetto
trace file; sessions found by the text of their content and by a time range."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from tests.daemon_process import DaemonProcess
from tests.ui.webui_support import login

MODEL = "sim-llama3-8b"
PROMPT_PRICE, COMPLETION_PRICE = 2.0, 10.0
CONFIG = f"""
content_max_chars = 200

[slo.tenants.loud]
content_tracing = true

[prices.{MODEL}]
prompt_per_mtok = {PROMPT_PRICE}
completion_per_mtok = {COMPLETION_PRICE}
"""
KEY = "sk-" + "Zq9" * 10
WORD = f"needle{uuid.uuid4().hex[:12]}"  # only in the loud tenant's prompt
QUIET_WORD = f"hay{uuid.uuid4().hex[:12]}"  # only in the quiet tenant's prompt


@dataclass
class World:
    d: DaemonProcess
    loud_token: str
    reply: str  # the loud program's first answer
    started: float


def chat(d: DaemonProcess, tenant: str, program: str, text: str, max_tokens: int = 6,
         session: str | None = None) -> str:
    body = {"model": MODEL, "max_tokens": max_tokens, "program_id": program,
            "session_id": session or f"s-{program}",
            "messages": [{"role": "system", "content": "You are terse."},
                         {"role": "user", "content": text}]}
    r = d.post("/v1/chat/completions", json=body, headers={"X-Tenant": tenant})
    assert r.status_code == 200, r.text
    return str(r.json()["choices"][0]["message"]["content"])


def get(d: DaemonProcess, path: str, token: str | None = None, **params: Any
        ) -> dict[str, Any]:
    r = d.get(path, token=token, params=params)
    assert r.status_code == 200, r.text
    return dict(r.json())


def requests_of(d: DaemonProcess, program: str) -> list[dict[str, Any]]:
    return list(get(d, f"/v1/programs/{program}")["requests"])


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    tmp = tmp_path_factory.mktemp("content")
    (tmp / "agentd.toml").write_text(CONFIG)
    d = DaemonProcess(tmp / "data", extra_args=["--config", str(tmp / "agentd.toml")]).start()
    try:
        started = time.time()
        reply = chat(d, "loud", "p-loud",
                     f"find {WORD} with {KEY} for ann@example.org " + "z" * 400)
        chat(d, "loud", "p-loud", "and again", max_tokens=3)
        chat(d, "loud", "p-loud-2", "one more", session="s-p-loud")  # a second track
        chat(d, "quiet", "p-quiet", f"find {QUIET_WORD}")
        done = d.cli("token", "create", "--scope", "read", "--name", "loud",
                     "--tenant", "loud")
        assert done.returncode == 0, done.stderr
        yield World(d, done.stdout.strip(), reply, started)
    finally:
        d.stop()


def test_a_tracing_tenant_s_request_shows_its_content_redacted_and_capped(
        world: World) -> None:
    first, second = requests_of(world.d, "p-loud")
    body = get(world.d, f"/v1/requests/{first['id']}")
    content = body["content"]
    system, user = content["prompt"]["messages"]
    # the messages share the cap, the newest first: the long user turn took it all
    assert system == {"role": "system", "content": "…[truncated 14 chars]",
                      "tool_calls": [], "tool_call_id": None, "name": None}
    assert user["content"].startswith(f"find {WORD} with [REDACTED] for [REDACTED] zzz")
    assert KEY not in json.dumps(body) and "ann@example.org" not in json.dumps(body)
    assert user["content"].endswith(" chars]") and "…[truncated " in user["content"]
    assert content["truncated"] and content["redactions"] == 2
    assert content["completion"] == world.reply and world.reply
    assert get(world.d, f"/v1/requests/{second['id']}")["content"]["completion"]


def test_a_tenant_without_tracing_has_nothing_stored(world: World) -> None:
    [req] = requests_of(world.d, "p-quiet")
    body = get(world.d, f"/v1/requests/{req['id']}")
    assert body["content"] is None and body["status"] == "finished"
    assert QUIET_WORD not in json.dumps(get(world.d, "/v1/sessions/s-p-quiet/export"))


def _expected(reqs: list[dict[str, Any]]) -> tuple[int, int, float]:
    p = sum(r["prompt_tokens"] for r in reqs)
    c = sum(r["output_tokens"] for r in reqs)
    return p, c, (p * PROMPT_PRICE + c * COMPLETION_PRICE) / 1e6


def test_token_totals_and_cost_per_session_program_and_tenant(world: World) -> None:
    program = requests_of(world.d, "p-loud")
    session = program + requests_of(world.d, "p-loud-2")
    for path, reqs in (("/v1/sessions/s-p-loud", session), ("/v1/programs/p-loud", program)):
        p, c, cost = _expected(reqs)
        assert p > 0 and c > 0
        usage = get(world.d, path)["usage"]
        assert (usage["requests"], usage["prompt_tokens"], usage["completion_tokens"]) == \
            (len(reqs), p, c), path
        assert usage["cost"] == pytest.approx(cost) and usage["unpriced"] == []
        [line] = usage["by_model"]
        assert line["model"] == MODEL and line["cost"] == pytest.approx(cost)
    by_tenant = {u["tenant"]: u for u in get(world.d, "/v1/usage")["data"]}
    assert {"loud", "quiet"} <= set(by_tenant)
    assert by_tenant["loud"]["prompt_tokens"] == _expected(session)[0]
    assert by_tenant["quiet"]["prompt_tokens"] == _expected(requests_of(world.d, "p-quiet"))[0]
    # a tenant's token sees its own tenant's usage only
    own = get(world.d, "/v1/usage", token=world.loud_token)["data"]
    assert [u["tenant"] for u in own] == ["loud"]


def test_the_json_export_holds_programs_requests_content_and_trace(world: World) -> None:
    r = world.d.get("/v1/sessions/s-p-loud/export", params={"format": "json"})
    assert r.status_code == 200, r.text
    assert 'filename="s-p-loud.json"' in r.headers["content-disposition"]
    body = r.json()
    assert body["session"]["id"] == "s-p-loud" and body["session"]["tenant"] == "loud"
    assert [p["id"] for p in body["programs"]] == ["p-loud", "p-loud-2"]
    assert body["requests"][0]["content"]["completion"] == world.reply
    assert all(q["content"]["prompt"]["messages"] for q in body["requests"])
    kinds = [e["kind"] for e in body["trace"]]
    assert kinds.count("request.finished") == 3 and not body["trace_truncated"]
    assert body["usage"]["requests"] == 3


def test_the_perfetto_export_is_a_trace_event_file(world: World) -> None:
    r = world.d.get("/v1/sessions/s-p-loud/export", params={"format": "perfetto"})
    assert r.status_code == 200, r.text
    trace = json.loads(r.content)
    events = trace["traceEvents"]
    assert events and all({"ph", "pid", "tid", "name"} <= set(e) for e in events)
    tracks = {e["args"]["name"]: e["tid"] for e in events
              if e["ph"] == "M" and e["name"] == "thread_name"}
    assert len({tracks["session"], tracks["program p-loud"], tracks["program p-loud-2"]}) == 3
    requests = [e for e in events if e["ph"] == "X" and e["cat"] == "request"]
    assert [e["tid"] for e in requests].count(tracks["program p-loud-2"]) == 1
    slices = [e for e in requests if e["tid"] == tracks["program p-loud"]]
    assert len(slices) == 2
    for e in events:
        if e["ph"] in ("X", "i"):
            assert e["ts"] >= 0, e
        if e["ph"] == "X":
            assert e["dur"] >= 0, e
    # one call at a time per program: its requests follow each other on its track
    first, second = sorted(slices, key=lambda e: e["ts"])
    assert first["ts"] + first["dur"] <= second["ts"]
    for s in requests:  # the queue wait and the generation nest inside the request
        phases = [e for e in events if e["ph"] == "X" and e["cat"] == "phase"
                  and s["ts"] <= e["ts"] and e["ts"] + e["dur"] <= s["ts"] + s["dur"] + 1e-3
                  and e["tid"] == s["tid"]]
        assert {e["name"] for e in phases} == {"queued", "generate"}
    instants = [e for e in events if e["ph"] == "i"]
    assert {"request.queued", "request.finished"} <= {e["name"] for e in instants}
    assert all(e["s"] == "t" for e in instants)
    assert trace["otherData"]["session_id"] == "s-p-loud"


def test_export_refuses_an_unknown_format_and_session(world: World) -> None:
    r = world.d.get("/v1/sessions/s-p-loud/export", params={"format": "xml"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "format", r.text
    r = world.d.get("/v1/sessions/nope/export")
    assert r.status_code == 404, r.text


def _found(d: DaemonProcess, **params: Any) -> set[str]:
    return {s["id"] for s in get(d, "/v1/sessions", **params)["data"]}


def test_sessions_are_found_by_the_text_of_their_content_and_a_time_range(
        world: World) -> None:
    d = world.d
    assert _found(d, q=WORD) == {"s-p-loud"}
    assert _found(d, q=WORD.upper()) == {"s-p-loud"}  # any case
    assert _found(d, q=world.reply[:20]) >= {"s-p-loud"}  # a completion's text
    assert _found(d, q=QUIET_WORD) == set()  # never stored
    assert _found(d, q="p-quiet") == {"s-p-quiet"}  # the id, as before
    assert _found(d, q=KEY) == set()  # redacted before storing
    assert {"s-p-loud", "s-p-quiet"} <= _found(d, since="-3600")
    assert _found(d, since=str(time.time() + 3600)) == set()
    assert _found(d, until=str(world.started - 60)) == set()
    iso = time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime(world.started - 60))
    assert "s-p-loud" in _found(d, since=iso, q=WORD)


@pytest.mark.parametrize(("params", "field"), [
    ({"since": "yesterday"}, "since"),
    ({"until": "nan"}, "until"),
    ({"since": "2000", "until": "1000"}, "until"),
])
def test_a_bad_time_range_names_its_field(world: World, params: dict[str, str],
                                          field: str) -> None:
    r = httpx.get(f"{world.d.url}/v1/sessions", params=params,
                  headers=world.d.auth_headers(), timeout=10)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == field, r.text


def test_the_web_pages_show_content_totals_and_export(world: World) -> None:
    c = login(world.d)
    first = requests_of(world.d, "p-loud")[0]
    page = c.get("/ui/request", params={"id": first["id"]})
    assert page.status_code == 200, page.text
    assert 'id="request-content"' in page.text and WORD in page.text
    assert world.reply in page.text and KEY not in page.text
    [quiet] = requests_of(world.d, "p-quiet")
    page = c.get("/ui/request", params={"id": quiet["id"]})
    assert "No content stored" in page.text and QUIET_WORD not in page.text
    session = c.get("/ui/session", params={"id": "s-p-loud"})
    assert session.status_code == 200, session.text
    usage = get(world.d, "/v1/sessions/s-p-loud")["usage"]
    assert 'id="session-usage"' in session.text
    assert f"{usage['cost']:.6f}" in session.text and 'id="session-export"' in session.text
    program = c.get("/ui/program", params={"id": "p-loud"})
    assert 'id="program-usage"' in program.text
    export = c.get("/ui/session/export", params={"id": "s-p-loud", "format": "perfetto"})
    assert export.status_code == 200 and "attachment" in export.headers["content-disposition"]
    assert export.json()["traceEvents"]
    bad = c.get("/ui/session/export", params={"id": "s-p-loud", "format": "xml"})
    assert bad.status_code == 400 and "format" in bad.text
