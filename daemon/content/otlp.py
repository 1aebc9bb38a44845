"""A session's record as OpenTelemetry spans with the GenAI semantic conventions, sent to
an OTLP/HTTP endpoint (`otlp_endpoint`, the operator's collector).

One trace per session: a root span for the session (`gen_ai.conversation.id`), an
`invoke_agent {program}` span per program, and under it a `chat {model}` span per LLM
request (`gen_ai.request.model`, `gen_ai.usage.input_tokens` / `output_tokens`,
`gen_ai.response.finish_reasons`; `gen_ai.input.messages` / `gen_ai.output.messages`
where the tenant traces content) and an `execute_tool {tool}` span per tool execution
(`gen_ai.tool.name`), each with its recorded start and end.

The SDK's exporter is synchronous (it posts and retries): `send` runs in a thread, never
on the event loop. Each export has its own tracer provider, so nothing is global and
nothing outlives the call.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SpanExportResult
from opentelemetry.trace import SpanKind, Status, StatusCode

from daemon.content.export import tool_execs

PROVIDER = "agentd"


class OtlpError(Exception):
    """The endpoint did not take the spans."""


class _Collect(SpanProcessor):
    def __init__(self) -> None:
        self.spans: list[ReadableSpan] = []

    def on_end(self, span: ReadableSpan) -> None:
        self.spans.append(span)


def _ns(t: float) -> int:
    return int(t * 1e9)


def spans_of(record: dict[str, Any], now: float) -> list[ReadableSpan]:
    """The session's spans, ended, in the order they were made."""
    collect = _Collect()
    provider = TracerProvider(resource=Resource.create({"service.name": "agentd"}),
                              shutdown_on_exit=False)
    provider.add_span_processor(collect)
    tracer = provider.get_tracer("agentd.content")
    session = record["session"]
    ends = [r["finished_at"] or now for r in record["requests"]] + \
        [e["ts"] for e in record["trace"]] + [session["created_at"]]
    session_end = max(ends)
    root = tracer.start_span(
        f"session {session['id']}", kind=SpanKind.INTERNAL,
        start_time=_ns(session["created_at"]),
        attributes={"gen_ai.conversation.id": session["id"], "agentd.tenant": session["tenant"],
                    "gen_ai.provider.name": PROVIDER})
    root_ctx = trace.set_span_in_context(root)
    execs = tool_execs(record["trace"], now)
    for program in record["programs"]:
        requests = [r for r in record["requests"] if r["program_id"] == program["id"]]
        mine = [x for x in execs if x["program_id"] == program["id"]]
        end = max([program["stopped_at"] or 0.0] + [r["finished_at"] or now for r in requests]
                  + [x["end"] for x in mine] + [program["created_at"]])
        agent = tracer.start_span(
            f"invoke_agent {program['id']}", context=root_ctx, kind=SpanKind.INTERNAL,
            start_time=_ns(program["created_at"]),
            attributes={"gen_ai.operation.name": "invoke_agent",
                        "gen_ai.agent.id": program["id"], "gen_ai.agent.name": program["id"],
                        "gen_ai.conversation.id": session["id"],
                        "gen_ai.provider.name": PROVIDER,
                        "agentd.program.status": program["status"]})
        if program["status"] == "FAILED":
            agent.set_status(Status(StatusCode.ERROR, program["status_reason"]))
        ctx = trace.set_span_in_context(agent)
        for req in requests:
            _chat_span(tracer, ctx, req, session["id"], now)
        for x in mine:
            span = tracer.start_span(
                f"execute_tool {x['tool']}", context=ctx, kind=SpanKind.INTERNAL,
                start_time=_ns(x["start"]),
                attributes={"gen_ai.operation.name": "execute_tool",
                            "gen_ai.tool.name": x["tool"], "gen_ai.tool.type": "extension",
                            "gen_ai.tool.call.id": str(x["exec_id"])})
            if x["ok"] is False:
                span.set_status(Status(StatusCode.ERROR, str(x["reason"])))
            span.end(end_time=_ns(x["end"]))
        agent.end(end_time=_ns(max(end, program["created_at"])))
    root.end(end_time=_ns(session_end))
    provider.shutdown()
    return collect.spans


def _chat_span(tracer: trace.Tracer, ctx: Any, req: dict[str, Any], session_id: str,
               now: float) -> None:
    attrs: dict[str, Any] = {
        "gen_ai.operation.name": "chat" if req["kind"] == "chat" else "text_completion",
        "gen_ai.provider.name": PROVIDER, "gen_ai.conversation.id": session_id,
        "gen_ai.request.model": req["model"], "gen_ai.response.model": req["model"],
        "gen_ai.response.id": req["id"], "gen_ai.request.max_tokens": req["max_tokens"],
        "gen_ai.usage.input_tokens": req["prompt_tokens"],
        "gen_ai.usage.output_tokens": req["output_tokens"],
        "agentd.cached_tokens": req["cached_tokens"], "agentd.status": req["status"],
    }
    if req["finish_reason"]:
        attrs["gen_ai.response.finish_reasons"] = [req["finish_reason"]]
    if req["worker_id"]:
        attrs["agentd.worker_id"] = req["worker_id"]
    content = req.get("content")
    if content is not None:
        attrs["gen_ai.input.messages"] = json.dumps(
            content["prompt"].get("messages") or [content["prompt"]])
        attrs["gen_ai.output.messages"] = json.dumps([{
            "role": "assistant", "content": content["completion"],
            "tool_calls": content["tool_calls"]}])
    span = tracer.start_span(f"{attrs['gen_ai.operation.name']} {req['model']}", context=ctx,
                             kind=SpanKind.CLIENT, start_time=_ns(req["queued_at"]),
                             attributes=attrs)
    if req["status"] == "failed":
        span.set_status(Status(StatusCode.ERROR, req["error"] or "failed"))
    span.end(end_time=_ns(max(req["finished_at"] or now, req["queued_at"])))


def send(record: dict[str, Any], now: float, endpoint: str, headers: Mapping[str, str],
         timeout_s: float) -> int:
    """Blocking: export the session's spans to `endpoint`; how many were sent."""
    spans = spans_of(record, now)
    exporter = OTLPSpanExporter(endpoint=endpoint, headers=dict(headers), timeout=timeout_s)
    try:
        result = exporter.export(spans)
    finally:
        exporter.shutdown()  # type: ignore[no-untyped-call]  # the SDK's own
    if result is not SpanExportResult.SUCCESS:
        raise OtlpError(f"the OTLP endpoint {endpoint} did not take the spans "
                        f"(see the daemon's log)")
    return len(spans)
