"""A small typed client for agentd's public REST API, sync and async.

Endpoints are described once as `Call` values (see `api`); `AgentdClient` and
`AsyncAgentdClient` only differ in how they send them, so the CLI and the TUI
share every path, parameter and error message. Transport and HTTP failures are
translated once, here, into `ClientError` with a message fit for one line.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
from prometheus_client.parser import text_string_to_metric_families

DEFAULT_URL = "http://127.0.0.1:8420"
DEFAULT_TIMEOUT_S = 30.0
# Generation can legitimately take minutes on a real engine; only connecting is bounded.
GENERATION_READ_TIMEOUT_S = 600.0

Json = Any


class ClientError(Exception):
    """A failure to show the user as one line; `status`/`code` when the daemon answered."""

    def __init__(self, message: str, status: int | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.code = code


# --- configuration ------------------------------------------------------------------


def token_path(env: Mapping[str, str] | None = None) -> Path:
    env = os.environ if env is None else env
    if env.get("AGENTD_CONFIG_DIR"):  # the same override the daemon writes its token under
        return Path(env["AGENTD_CONFIG_DIR"]) / "token"
    base = env.get("XDG_CONFIG_HOME") or str(Path(env.get("HOME") or Path.home()) / ".config")
    return Path(base) / "agentd" / "token"


def resolve_url(flag: str | None, env: Mapping[str, str] | None = None) -> str:
    env = os.environ if env is None else env
    return (flag or env.get("AGENTD_URL") or DEFAULT_URL).rstrip("/")


def resolve_token(flag: str | None, env: Mapping[str, str] | None = None) -> str | None:
    """--token, then $AGENTD_TOKEN, then the token file; None when none is set."""
    env = os.environ if env is None else env
    if flag:
        return flag
    if env.get("AGENTD_TOKEN"):
        return env["AGENTD_TOKEN"]
    path = token_path(env)
    if not path.is_file():
        return None
    try:
        return path.read_text().strip() or None
    except OSError as exc:
        raise ClientError(f"cannot read the token file {path}: {exc.strerror}") from exc


# --- endpoints ----------------------------------------------------------------------


@dataclass(frozen=True)
class Call:
    """One HTTP exchange with the daemon, independent of sync or async sending."""

    method: str
    path: str
    params: dict[str, Any] = field(default_factory=dict)
    body: dict[str, Any] | None = None
    # statuses whose body is still a normal answer (healthz says "degraded" with 503)
    accept: tuple[int, ...] = ()
    text: bool = False
    generation: bool = False


class api:
    """Builders for every endpoint the consoles use: `client.call(api.workers())`.

    Lower-case because it reads as a namespace at the call site, not as a type.
    """

    @staticmethod
    def healthz() -> Call:
        return Call("GET", "/healthz", accept=(503,))

    @staticmethod
    def metrics() -> Call:
        return Call("GET", "/metrics", text=True)

    @staticmethod
    def scheduling() -> Call:
        """The SLO stack: active policies, controls, the daemon's goodput and counters."""
        return Call("GET", "/v1/scheduling")

    @staticmethod
    def workers() -> Call:
        return Call("GET", "/v1/workers")

    @staticmethod
    def models() -> Call:
        return Call("GET", "/v1/models")

    @staticmethod
    def programs(status: str | None = None, session: str | None = None,
                 limit: int = 100, offset: int = 0) -> Call:
        params = _drop_none(status=status, session=session, limit=limit, offset=offset)
        return Call("GET", "/v1/programs", params)

    @staticmethod
    def program(program_id: str) -> Call:
        return Call("GET", f"/v1/programs/{_seg(program_id)}")

    @staticmethod
    def release(program_id: str) -> Call:
        return Call("POST", f"/v1/programs/{_seg(program_id)}/release")

    @staticmethod
    def release_idle(idle_s: float, dry_run: bool = False, tenant: str | None = None) -> Call:
        """POST /v1/programs/release-idle: end every program quiet for at least `idle_s`
        (with `dry_run`, only list them)."""
        return Call("POST", "/v1/programs/release-idle",
                    body=_drop_none(idle_s=idle_s, dry_run=dry_run, tenant=tenant))

    @staticmethod
    def program_action(action: str, program_id: str) -> Call:
        """POST /v1/programs/{id}/pause|resume|release|kill."""
        if action not in ("pause", "resume", "release", "kill"):
            raise ValueError(f"unknown program action {action!r}")
        return Call("POST", f"/v1/programs/{_seg(program_id)}/{action}")

    @staticmethod
    def migrate(kind: str, ident: str, worker_id: str, now: bool = False) -> Call:
        """POST /v1/programs/{id}/migrate or /v1/sessions/{id}/migrate."""
        return Call("POST", f"/v1/{kind}s/{_seg(ident)}/migrate",
                    body={"worker_id": worker_id, "now": now})

    @staticmethod
    def tools() -> Call:
        return Call("GET", "/v1/tools")

    @staticmethod
    def tools_gc(dry_run: bool) -> Call:
        return Call("POST", "/v1/tools/gc", body={"dry_run": dry_run})

    @staticmethod
    def policies() -> Call:
        return Call("GET", "/v1/policies")

    @staticmethod
    def policy(name: str) -> Call:
        """One policy: its versions (without source), events and the active source."""
        return Call("GET", f"/v1/policies/{_seg(name)}")

    @staticmethod
    def policy_version(name: str, version: int) -> Call:
        return Call("GET", f"/v1/policies/{_seg(name)}/versions/{int(version)}")

    @staticmethod
    def policy_diff(name: str, old: int, new: int) -> Call:
        return Call("GET", f"/v1/policies/{_seg(name)}/diff", {"from": old, "to": new})

    @staticmethod
    def policy_put(name: str, layer: str, source: str) -> Call:
        """Store a new version; the answer carries its validation report."""
        return Call("PUT", f"/v1/policies/{_seg(name)}", body={"layer": layer, "source": source})

    @staticmethod
    def policy_validate(name: str, version: int | None = None) -> Call:
        return Call("POST", f"/v1/policies/{_seg(name)}/validate",
                    body=_drop_none(version=version))

    @staticmethod
    def policy_activate(name: str, version: int | None = None) -> Call:
        return Call("POST", f"/v1/policies/{_seg(name)}/activate",
                    body=_drop_none(version=version))

    @staticmethod
    def policy_rollback(name: str) -> Call:
        return Call("POST", f"/v1/policies/{_seg(name)}/rollback")

    @staticmethod
    def sessions(limit: int = 100, offset: int = 0) -> Call:
        return Call("GET", "/v1/sessions", {"limit": limit, "offset": offset})

    @staticmethod
    def session(session_id: str) -> Call:
        return Call("GET", f"/v1/sessions/{_seg(session_id)}")

    @staticmethod
    def trace(session_id: str, after: int = 0, limit: int = 500) -> Call:
        return Call("GET", f"/v1/sessions/{_seg(session_id)}/trace",
                    {"after": after, "limit": limit})

    @staticmethod
    def runs() -> Call:
        return Call("GET", "/v1/runs")

    @staticmethod
    def run_control(run_id: str) -> Call:
        """A run's agent instances, live calls and installed rules, as last reported."""
        return Call("GET", f"/v1/runs/{_seg(run_id)}/control")

    @staticmethod
    def run_decisions(run_id: str, decisions: list[dict[str, Any]]) -> Call:
        """Operator decisions (route, migrate, kill...) for one run, in the run's names."""
        return Call("POST", f"/v1/runs/{_seg(run_id)}/control/decisions",
                    body={"decisions": decisions})

    @staticmethod
    def chat(model: str, messages: list[dict[str, Any]], max_tokens: int | None = None,
             program_id: str | None = None, session_id: str | None = None,
             stream: bool = False) -> Call:
        body = _drop_none(model=model, messages=messages, max_tokens=max_tokens,
                          program_id=program_id, session_id=session_id)
        if stream:
            body.update(stream=True, stream_options={"include_usage": True})
        return Call("POST", "/v1/chat/completions", body=body, generation=True)


def _drop_none(**kw: Any) -> dict[str, Any]:
    return {k: v for k, v in kw.items() if v is not None}


def _seg(value: str) -> str:
    """Quote an id for a path segment, so 'a/b' cannot reach another endpoint."""
    return quote(value, safe="")


MetricSample = tuple[str, dict[str, str], float]


def metric_samples(text: str) -> list[MetricSample]:
    """Every sample of a /metrics page as (name, labels, value): prometheus_client's parser,
    the one the consoles use. A counter's samples carry their `_total` name."""
    return [(s.name, dict(s.labels), s.value)
            for family in text_string_to_metric_families(text) for s in family.samples]


def metric_sums(text: str) -> dict[str, float]:
    """Each sample name's sum over its label sets (tokens over every worker, say); a
    histogram gives its `_count` and `_sum`, not its buckets (a sum over `le` means nothing),
    and prometheus_client's `_created` timestamps are left out."""
    out: dict[str, float] = {}
    for name, _, value in metric_samples(text):
        if not name.endswith(("_bucket", "_created")):
            out[name] = out.get(name, 0.0) + value
    return out


# --- translation at the boundary ----------------------------------------------------


def _transport_error(exc: httpx.TransportError, url: str) -> ClientError:
    if isinstance(exc, httpx.ConnectError):
        return ClientError(f"cannot reach the agentd daemon at {url} "
                           "(is it running? start it with `agentd start`)")
    if isinstance(exc, httpx.TimeoutException):
        return ClientError(f"the agentd daemon at {url} did not answer in time")
    return ClientError(f"lost the connection to the agentd daemon at {url}: "
                       f"{exc or type(exc).__name__}")


def _http_error(status: int, body: bytes) -> ClientError:
    try:
        err = json.loads(body)["error"]
        return ClientError(str(err["message"]), status, err.get("code"))
    except (ValueError, KeyError, TypeError):
        snippet = body.decode(errors="replace").strip().splitlines()[:1]
        detail = f": {snippet[0][:200]}" if snippet else ""
        return ClientError(f"the daemon answered HTTP {status}{detail}", status)


def _decode(call: Call, response: httpx.Response) -> Json:
    if response.status_code >= 400 and response.status_code not in call.accept:
        raise _http_error(response.status_code, response.content)
    if call.text:
        return response.text
    try:
        return response.json()
    except ValueError as exc:
        raise ClientError(f"the daemon's answer to {call.path} is not JSON "
                          "(is this URL an agentd daemon?)") from exc


def _sse_event(line: str) -> Json | None:
    """The JSON payload of one SSE `data:` line; None for other lines and [DONE]."""
    if not line.startswith("data:"):
        return None
    data = line[5:].strip()
    if not data or data == "[DONE]":
        return None
    try:
        event = json.loads(data)
    except ValueError as exc:
        raise ClientError("the daemon sent a malformed stream event") from exc
    if isinstance(event, dict) and isinstance(event.get("error"), dict):
        raise ClientError(str(event["error"].get("message", "stream failed")),
                          code=event["error"].get("code"))
    return event


# --- clients ------------------------------------------------------------------------


class _Base:
    def __init__(self, url: str | None = None, token: str | None = None,
                 timeout: float = DEFAULT_TIMEOUT_S) -> None:
        self.url = resolve_url(url)
        self.token = resolve_token(token)
        self.timeout = timeout

    @property
    def headers(self) -> dict[str, str]:
        headers = {"User-Agent": "agentctl", "Accept": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        return headers

    def _timeout(self, call: Call) -> httpx.Timeout:
        if call.generation:
            return httpx.Timeout(self.timeout, read=max(self.timeout, GENERATION_READ_TIMEOUT_S))
        return httpx.Timeout(self.timeout)

    def _request_args(self, call: Call) -> dict[str, Any]:
        return {"method": call.method, "url": call.path, "params": call.params or None,
                "json": call.body, "timeout": self._timeout(call)}


@dataclass
class SseStream:
    """An open streaming answer: its headers now, its events as they arrive."""

    headers: Mapping[str, str]
    _lines: Iterator[str]

    def events(self) -> Iterator[Json]:
        for line in self._lines:
            event = _sse_event(line)
            if event is not None:
                yield event


@dataclass
class AsyncSseStream:
    headers: Mapping[str, str]
    _lines: AsyncIterator[str]

    async def events(self) -> AsyncIterator[Json]:
        async for line in self._lines:
            event = _sse_event(line)
            if event is not None:
                yield event


class AgentdClient(_Base):
    """Blocking client for the CLI. Use as a context manager, or call close()."""

    def __init__(self, url: str | None = None, token: str | None = None,
                 timeout: float = DEFAULT_TIMEOUT_S) -> None:
        super().__init__(url, token, timeout)
        self._http = httpx.Client(base_url=self.url, headers=self.headers)

    def __enter__(self) -> AgentdClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def call(self, call: Call) -> Json:
        try:
            response = self._http.request(**self._request_args(call))
        except httpx.TransportError as exc:
            raise _transport_error(exc, self.url) from exc
        return _decode(call, response)

    @contextmanager
    def stream(self, call: Call) -> Iterator[SseStream]:
        try:
            with self._http.stream(**self._request_args(call)) as response:
                if response.status_code >= 400:
                    raise _http_error(response.status_code, response.read())
                yield SseStream(response.headers, response.iter_lines())
        except httpx.TransportError as exc:
            raise _transport_error(exc, self.url) from exc


class AsyncAgentdClient(_Base):
    """The same calls for asyncio callers (the TUI).

    `transport` replaces the network, e.g. with a fixed in-process dataset for
    rendering tests; everything above it (paths, decoding, errors) stays the same.
    """

    def __init__(self, url: str | None = None, token: str | None = None,
                 timeout: float = DEFAULT_TIMEOUT_S,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        super().__init__(url, token, timeout)
        self._http = httpx.AsyncClient(base_url=self.url, headers=self.headers,
                                       transport=transport)

    async def __aenter__(self) -> AsyncAgentdClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def call(self, call: Call) -> Json:
        try:
            response = await self._http.request(**self._request_args(call))
        except httpx.TransportError as exc:
            raise _transport_error(exc, self.url) from exc
        return _decode(call, response)

    @asynccontextmanager
    async def stream(self, call: Call) -> AsyncIterator[AsyncSseStream]:
        try:
            async with self._http.stream(**self._request_args(call)) as response:
                if response.status_code >= 400:
                    raise _http_error(response.status_code, await response.aread())
                yield AsyncSseStream(response.headers, response.aiter_lines())
        except httpx.TransportError as exc:
            raise _transport_error(exc, self.url) from exc


def trace_pages(client: AgentdClient, session_id: str, page: int = 500) -> Iterator[list[Json]]:
    """Every trace event of a session, one page at a time, following `next_after`."""
    after = 0
    while True:
        answer = client.call(api.trace(session_id, after, page))
        yield answer["data"]
        if answer.get("next_after") is None:
            return
        after = int(answer["next_after"])
