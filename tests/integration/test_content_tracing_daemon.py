"""Content tracing on a real daemon with the sim engine (daemon/content/): a tenant that
turns it on gets each request's prompt, completion and tool arguments stored, redacted and
capped, shown with the request; a tenant that does not gets nothing stored. Token totals
and cost per session, program and tenant; a session's export as JSON and as a Perfetto
trace file; sessions found by the text of their content and by a time range."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from tests.daemon_process import DaemonProcess
from tests.store_fixtures import DATABASES, module_db
from tests.ui.webui_support import login

MODEL = "sim-llama3-8b"
PROMPT_PRICE, COMPLETION_PRICE = 2.0, 10.0
CONFIG = """
content_max_chars = 200
otlp_endpoint = "http://127.0.0.1:{otlp_port}/v1/traces"

[otlp_headers]
x-collector-key = "k123"

[tools.shell]
backend = "process"
command = []
exec_timeout_s = 10

[slo.tenants.loud]
content_tracing = true

[prices.{model}]
prompt_per_mtok = {prompt_price}
completion_per_mtok = {completion_price}
"""
KEY = "sk-" + "Zq9" * 10
WORD = f"needle{uuid.uuid4().hex[:12]}"  # only in the loud tenant's prompt
QUIET_WORD = f"hay{uuid.uuid4().hex[:12]}"  # only in the quiet tenant's prompt


class OtlpReceiver(ThreadingHTTPServer):
    """An OTLP/HTTP traces endpoint: keeps each export request it is sent, decoded."""

    def __init__(self) -> None:
        self.exports: list[tuple[dict[str, str], ExportTraceServiceRequest]] = []
        super().__init__(("127.0.0.1", 0), _OtlpHandler)

    @property
    def port(self) -> int:
        return int(self.server_address[1])


class _OtlpHandler(BaseHTTPRequestHandler):
    server: OtlpReceiver

    def do_POST(self) -> None:  # http.server calls it by this name
        body = self.rfile.read(int(self.headers["Content-Length"]))
        message = ExportTraceServiceRequest()
        message.ParseFromString(body)
        self.server.exports.append(({k.lower(): v for k, v in self.headers.items()}, message))
        answer = ExportTraceServiceResponse().SerializeToString()
        self.send_response(200 if self.path == "/v1/traces" else 404)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args: Any) -> None:
        pass


@dataclass
class World:
    d: DaemonProcess
    loud_token: str
    reply: str  # the loud program's first answer
    started: float
    otlp: OtlpReceiver


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


@pytest.fixture(scope="module", params=DATABASES)
def world(request: pytest.FixtureRequest,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    """On each store: content search (LIKE over JSON read as text), totals and exports."""
    with module_db(request) as db:
        yield from _world(tmp_path_factory.mktemp("content"), db)


def _world(tmp: Path, db: str) -> Iterator[World]:
    receiver = OtlpReceiver()
    threading.Thread(target=receiver.serve_forever, daemon=True).start()
    (tmp / "agentd.toml").write_text(CONFIG.format(
        otlp_port=receiver.port, model=MODEL, prompt_price=PROMPT_PRICE,
        completion_price=COMPLETION_PRICE))
    d = DaemonProcess(tmp / "data", db=db,
                      extra_args=["--config", str(tmp / "agentd.toml")]).start()
    try:
        started = time.time()
        reply = chat(d, "loud", "p-loud",
                     f"find {WORD} with {KEY} for ann@example.org " + "z" * 400)
        chat(d, "loud", "p-loud", "and again", max_tokens=3)
        chat(d, "loud", "p-loud-2", "one more", session="s-p-loud")  # a second track
        r = d.post("/v1/programs/p-loud-2/tools/shell/exec", json={"command": "echo hi"})
        assert r.status_code == 200 and r.json()["exit_code"] == 0, r.text
        chat(d, "quiet", "p-quiet", f"find {QUIET_WORD}")
        done = d.cli("token", "create", "--scope", "read", "--name", "loud",
                     "--tenant", "loud")
        assert done.returncode == 0, done.stderr
        yield World(d, done.stdout.strip(), reply, started, receiver)
    finally:
        d.stop()
        receiver.shutdown()
        receiver.server_close()


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


def test_a_session_lists_its_stored_contents(world: World) -> None:
    body = get(world.d, "/v1/sessions/s-p-loud/contents")
    assert body["total"] == 3
    assert [c["program_id"] for c in body["data"]] == ["p-loud", "p-loud", "p-loud-2"]
    assert body["data"][0]["completion"] == world.reply
    newest = get(world.d, "/v1/sessions/s-p-loud/contents", limit=1)
    assert newest["total"] == 3 and [c["program_id"] for c in newest["data"]] == ["p-loud-2"]
    assert get(world.d, "/v1/sessions/s-p-quiet/contents") == {"data": [], "total": 0}
    one = get(world.d, "/v1/sessions/s-p-loud/contents", program_id="p-loud-2")
    assert one["total"] == 1 and [c["program_id"] for c in one["data"]] == ["p-loud-2"]
    r = world.d.get("/v1/sessions/s-p-loud/contents", params={"limit": 0})
    assert r.status_code == 400 and "limit" in r.text, r.text


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
    [tool] = [e for e in events if e["ph"] == "X" and e["cat"] == "tool"]
    assert tool["name"] == "tool shell" and tool["tid"] == tracks["program p-loud-2"]
    assert tool["args"]["ok"] is True and tool["dur"] > 0
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
    # by the status of a program it holds: all live (none released) until released
    assert {"s-p-loud", "s-p-quiet"} <= _found(d, status="acting")
    assert _found(d, status="STOPPED", q="p-quiet") == set()
    r = d.post("/v1/programs/p-quiet/release")
    assert r.status_code == 200, r.text
    assert _found(d, status="STOPPED", q="p-quiet") == {"s-p-quiet"}
    iso = time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime(world.started - 60))
    assert "s-p-loud" in _found(d, since=iso, q=WORD)


@pytest.mark.parametrize(("params", "field"), [
    ({"since": "yesterday"}, "since"),
    ({"until": "nan"}, "until"),
    ({"since": "2000", "until": "1000"}, "until"),
    ({"status": "sleeping"}, "status"),
])
def test_a_bad_time_range_or_status_names_its_field(world: World, params: dict[str, str],
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
    assert 'id="session-contents"' in session.text and WORD in session.text
    assert world.reply in session.text and KEY not in session.text
    quiet_page = c.get("/ui/session", params={"id": "s-p-quiet"})
    assert "No content stored" in quiet_page.text and QUIET_WORD not in quiet_page.text
    program = c.get("/ui/program", params={"id": "p-loud"})
    assert 'id="program-usage"' in program.text
    export = c.get("/ui/session/export", params={"id": "s-p-loud", "format": "perfetto"})
    assert export.status_code == 200 and "attachment" in export.headers["content-disposition"]
    assert export.json()["traceEvents"]
    bad = c.get("/ui/session/export", params={"id": "s-p-loud", "format": "xml"})
    assert bad.status_code == 400 and "format" in bad.text


def _attrs(span: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kv in span.attributes:
        v = kv.value
        kind = v.WhichOneof("value")
        out[kv.key] = [x.string_value for x in v.array_value.values] \
            if kind == "array_value" else getattr(v, kind)
    return out


def test_the_otlp_export_sends_genai_spans_to_the_configured_endpoint(world: World) -> None:
    before = len(world.otlp.exports)
    r = world.d.post("/v1/sessions/s-p-loud/export/otlp")
    assert r.status_code == 200, r.text
    assert len(world.otlp.exports) == before + 1  # the answer comes after the receiver's
    headers, message = world.otlp.exports[-1]
    assert headers["x-collector-key"] == "k123"
    spans = [s for rs in message.resource_spans for ss in rs.scope_spans for s in ss.spans]
    assert r.json()["spans"] == len(spans)
    by_name: dict[str, list[Any]] = {}
    for s in spans:
        by_name.setdefault(s.name.split(" ")[0], []).append(s)
    [root] = by_name["session"]
    agents, chats, tools = by_name["invoke_agent"], by_name["chat"], by_name["execute_tool"]
    assert {s.name for s in agents} == {"invoke_agent p-loud", "invoke_agent p-loud-2"}
    assert len({s.trace_id for s in spans}) == 1  # one trace per session
    assert all(a.parent_span_id == root.span_id for a in agents)
    agent_ids = {a.span_id: a.name for a in agents}
    assert sorted(agent_ids[c.parent_span_id] for c in chats) == \
        ["invoke_agent p-loud", "invoke_agent p-loud", "invoke_agent p-loud-2"]
    [tool] = tools
    assert agent_ids[tool.parent_span_id] == "invoke_agent p-loud-2"
    assert _attrs(tool)["gen_ai.tool.name"] == "shell"
    assert _attrs(tool)["gen_ai.operation.name"] == "execute_tool"
    first = min(chats, key=lambda c: c.start_time_unix_nano)
    a = _attrs(first)
    req = requests_of(world.d, "p-loud")[0]
    assert a["gen_ai.operation.name"] == "chat" and a["gen_ai.request.model"] == MODEL
    assert a["gen_ai.usage.input_tokens"] == req["prompt_tokens"]
    assert a["gen_ai.usage.output_tokens"] == req["output_tokens"]
    assert a["gen_ai.response.finish_reasons"] == [req["finish_reason"]]
    assert a["gen_ai.conversation.id"] == "s-p-loud"
    assert WORD in a["gen_ai.input.messages"] and KEY not in a["gen_ai.input.messages"]
    assert world.reply in a["gen_ai.output.messages"]
    for s in spans:
        assert s.start_time_unix_nano <= s.end_time_unix_nano, s.name
    assert first.end_time_unix_nano - first.start_time_unix_nano == pytest.approx(
        (req["finished_at"] - req["queued_at"]) * 1e9, abs=1e3)
    # a session of a tenant without content tracing: spans, no content
    r = world.d.post("/v1/sessions/s-p-quiet/export/otlp")
    assert r.status_code == 200, r.text
    quiet = [s for rs in world.otlp.exports[-1][1].resource_spans for ss in rs.scope_spans
             for s in ss.spans if s.name.startswith("chat")]
    assert quiet and "gen_ai.input.messages" not in _attrs(quiet[0])
