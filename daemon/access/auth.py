"""Bearer tokens with scopes, checked by one guard that every route goes through.

A route declares what it needs with `opt={"scope": READ}` (or a tuple of scopes, any
of which suffices); the guard refuses a route that declares nothing, so a new endpoint
is closed until someone decides who may call it. `operator` implies every other scope.

A workflow run's token (scope `submit`, issued by daemon/runtime/runs.py) is also bound
to its run (`RunScope`): it may act only on the run's own programs and session, so the
guard refuses it any route whose `program_id`, `session_id` or `run_id` path parameter
names something else, and the gateway refuses it a `program_id` / `session_id` outside
the run (`run_program`). Operator and ordinary `submit` tokens are not bound.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from litestar import Litestar
from litestar.connection import ASGIConnection
from litestar.handlers import BaseRouteHandler
from litestar.routes import HTTPRoute
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from daemon.errors import ApiError
from db import tokens

log = logging.getLogger("agentd.auth")

READ = "read"
SUBMIT = "submit"
OPERATOR = "operator"
SCOPES = (READ, SUBMIT, OPERATOR)
PUBLIC = "public"  # no token needed: only for liveness probes

# Revocation reaches the daemon through the store (the CLI writes it directly), so a
# cached token may stay usable this long after it is revoked. A lookup costs ~0.75 ms of
# event-loop and thread time on SQLite; the cache makes it ~1 us.
CACHE_TTL_S = 1.0

TOKEN_FILE = "token"
# A run's token is refused in memory this long after its run ended: far longer than the
# cache keeps a record, after which the store's revocation answers.
RETIRED_KEEP_S = 60 * CACHE_TTL_S


@dataclass(frozen=True, slots=True)
class RunScope:
    """What a run's token may act on. The run's programs are the ones the runtime creates
    and releases with it: the run's program and every `<program>.<suffix>` (the sandbox
    names an agent instance's program `<program>.<Agent>.<i>`), all in the run's session."""

    run_id: str
    program_id: str
    session_id: str

    def owns_program(self, program_id: str) -> bool:
        return program_id == self.program_id or program_id.startswith(self.program_id + ".")

    def owns(self, param: str, value: str) -> bool:
        """Whether a path parameter (one of BOUND_PARAMS) names something of this run."""
        if param == "program_id":
            return self.owns_program(value)
        if param == "session_id":
            return value == self.session_id
        return param != "run_id" or value == self.run_id

    def refusal(self, param: str, value: str | None, field: str | None = None) -> ApiError:
        """403 for `param` (as BOUND_PARAMS name it) sent as `field` (a body field or a
        header; default: the param's own name)."""
        field = field or param
        what = {"session_id": f"its own session '{self.session_id}'",
                "run_id": f"its own run '{self.run_id}'"}.get(
            param, f"its own programs ('{self.program_id}' and '{self.program_id}.*')")
        got = "none was given" if value is None else f"not '{value}'"
        return ApiError(403, f"{field}: run {self.run_id}'s token may act only on {what}, "
                        f"{got}", "run_token", param=field)


# Path parameters a run's token must own; every route that names one is checked.
BOUND_PARAMS = ("program_id", "session_id", "run_id")


@dataclass(frozen=True, slots=True)
class Principal:
    """Who made a request: `run` is set for a workflow run's token; `tenant` is the
    token's (empty: its id), which daemon/core/tenants.py turns into the
    request's tenant."""

    token_id: str
    name: str
    scopes: frozenset[str]
    run: RunScope | None = None
    tenant: str = ""


def parse_scopes(text: str) -> frozenset[str]:
    """'read,submit' or 'read submit' -> scopes; unknown names raise ValueError."""
    names = frozenset(s for s in text.replace(",", " ").split() if s)
    unknown = sorted(names - set(SCOPES))
    if unknown or not names:
        raise ValueError(f"unknown scope(s) {', '.join(unknown) or '(none given)'}; "
                         f"choose from {', '.join(SCOPES)}")
    return names


def grants(held: frozenset[str], needed: tuple[str, ...]) -> bool:
    return OPERATOR in held or any(scope in held for scope in needed)


def new_secret() -> str:
    return "agd_" + secrets.token_urlsafe(32)


def bearer(header: str | None) -> str | None:
    if not header:
        return None
    kind, _, value = header.strip().partition(" ")
    if kind.lower() != "bearer" or not value.strip():
        return None
    return value.strip()


# --- route declarations -------------------------------------------------------------


def declared_scopes(handler: BaseRouteHandler) -> tuple[str, ...] | None:
    if _is_auto_options(handler):
        # Litestar adds an OPTIONS handler to every path; it only lists the allowed methods.
        return (READ,)
    value = handler.opt.get("scope")
    if isinstance(value, str):
        return (value,)
    if isinstance(value, tuple | list) and value and all(isinstance(v, str) for v in value):
        return tuple(value)
    return None


def _is_auto_options(handler: BaseRouteHandler) -> bool:
    methods: set[str] = set(getattr(handler, "http_methods", ()))
    return methods == {"OPTIONS"} and handler.handler_name == "options_handler"


def iter_routes(app: Litestar) -> Iterator[tuple[str, str, BaseRouteHandler]]:
    """(method, path, handler) for every HTTP route the app serves."""
    for route in app.routes:
        if not isinstance(route, HTTPRoute):
            continue
        for handler in route.route_handlers:
            for method in sorted(handler.http_methods):
                yield method, route.path, handler


# --- tokens -------------------------------------------------------------------------


Sessions = async_sessionmaker[AsyncSession]


async def issue_token(s: AsyncSession, name: str, scopes: Iterable[str],
                      tenant: str | None = None) -> tuple[str, str]:
    """Store a new token; returns (id, secret). The secret exists only in the return value."""
    secret = new_secret()
    token_id = f"tok-{uuid.uuid4().hex[:12]}"
    await tokens.insert(s, token_id, name, tokens.hash_secret(secret), frozenset(scopes),
                        time.time(), tenant)
    return token_id, secret


def write_token_file(path: Path, secret: str) -> None:
    """Write the secret readable by the owner only, replacing any older file atomically."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)  # O_CREAT's mode does not apply to a leftover tmp file
        os.write(fd, (secret + "\n").encode())
    finally:
        os.close(fd)
    os.replace(tmp, path)


async def ensure_first_token(sessions: Sessions, config_dir: Path) -> Path | None:
    """On a store without tokens, create an operator token and write it to the config dir."""
    path = config_dir / TOKEN_FILE
    async with sessions() as s, s.begin():
        if await tokens.count(s):
            return None
        token_id, secret = await issue_token(s, "operator (first start)", {OPERATOR})
        # Written before the commit: if the file cannot be written, no token exists whose
        # secret nobody knows, and the next start tries again.
        write_token_file(path, secret)
    log.info("created operator token %s; its secret is in %s", token_id, path)
    return path


class TokenAuth:
    """Resolves bearer secrets to principals, with a short cache in front of the store."""

    def __init__(self, enabled: bool, ttl_s: float = CACHE_TTL_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.enabled = enabled
        self._ttl = ttl_s
        self._clock = clock
        self._sessions: Sessions | None = None
        self._cache: dict[str, tuple[float, tokens.TokenRecord]] = {}
        self._lookups: dict[str, asyncio.Task[tokens.TokenRecord | None]] = {}
        self._runs: dict[str, RunScope] = {}
        self._retired: dict[str, float] = {}

    def bind(self, sessions: Sessions) -> None:
        self._sessions = sessions

    def bind_run(self, token_id: str, scope: RunScope) -> None:
        """Bind a run's token to its run (before its secret leaves the daemon)."""
        self._runs[token_id] = scope

    def unbind_run(self, token_id: str) -> None:
        """At the run's end, after its token was revoked in the store. The token is refused
        here from now on: the cache (or a lookup that read the store just before the
        revocation) may still hold it as active, and unbound it would be a plain
        `submit` token."""
        self._runs.pop(token_id, None)
        now = self._clock()
        self._retired[token_id] = now
        for old in [t for t, at in self._retired.items() if now - at > RETIRED_KEEP_S]:
            del self._retired[old]

    async def principal(self, secret: str) -> Principal | None:
        """The principal for an active token, None for unknown or revoked ones."""
        record = await self._record(tokens.hash_secret(secret))
        if record is None or not record.active or record.id in self._retired:
            return None
        return Principal(token_id=record.id, name=record.name, scopes=record.scopes,
                         run=self._runs.get(record.id), tenant=record.tenant)

    async def _record(self, token_hash: str) -> tokens.TokenRecord | None:
        hit = self._cache.get(token_hash)
        if hit is not None:
            age = self._clock() - hit[0]
            if age < self._ttl:
                if age >= self._ttl / 2:
                    # Refreshed ahead, in the background: when an entry expired, every
                    # request carrying the token at that moment read the store (3-8
                    # reads of up to 86 ms under the swap benchmark's load).
                    self._lookup(token_hash)
                return hit[1]
        # Shielded: a cancelled request does not cancel the read others wait on.
        return await asyncio.shield(self._lookup(token_hash))

    def _lookup(self, token_hash: str) -> asyncio.Task[tokens.TokenRecord | None]:
        """One store read per token at a time, however many requests ask."""
        task = self._lookups.get(token_hash)
        if task is None:
            task = asyncio.create_task(self._read(token_hash))
            self._lookups[token_hash] = task
            task.add_done_callback(lambda t: self._lookup_done(token_hash, t))
        return task

    def _lookup_done(self, token_hash: str, task: asyncio.Task[Any]) -> None:
        self._lookups.pop(token_hash, None)
        if not task.cancelled() and task.exception() is not None:
            # A background refresh nobody awaits must not log "exception never
            # retrieved"; a request that awaited it got the exception already.
            log.debug("token lookup failed: %s", task.exception())

    async def _read(self, token_hash: str) -> tokens.TokenRecord | None:
        assert self._sessions is not None, "TokenAuth.bind() runs in the daemon's lifespan"
        async with self._sessions() as s:
            record = await tokens.find_by_hash(s, token_hash)
        now = self._clock()
        # Only hashes of real tokens are cached, so random guesses cannot grow the cache
        # and a token created a moment ago is usable at once.
        if record is None:
            self._cache.pop(token_hash, None)
        else:
            # Expired entries go here, or every run's token would stay cached for ever.
            for old in [h for h, (at, _) in self._cache.items() if now - at >= self._ttl]:
                del self._cache[old]
            self._cache[token_hash] = (now, record)
        return record


# --- the guard ----------------------------------------------------------------------


def principal_of(connection: ASGIConnection[Any, Any, Any, Any]) -> Principal | None:
    value = connection.scope.get("state", {}).get("agentd.principal")
    return value if isinstance(value, Principal) else None


async def require_scope(
    connection: ASGIConnection[Any, Any, Any, Any], handler: BaseRouteHandler
) -> None:
    needed = declared_scopes(handler)
    if needed is None:
        log.error("route %s declares no scope; refusing it", connection.url.path)
        raise ApiError(403, "this route declares no scope, so it is refused for everyone",
                       "scope_undeclared")
    if PUBLIC in needed:
        return
    auth: TokenAuth = connection.app.state["auth"]
    if not auth.enabled:
        return
    wanted = " or ".join(f"'{s}'" for s in needed)
    secret = bearer(connection.headers.get("authorization"))
    if secret is None:
        raise ApiError(401, f"missing API token: send 'Authorization: Bearer <token>' with "
                       f"scope {wanted}", "missing_api_key",
                       headers={"WWW-Authenticate": "Bearer"})
    principal = await auth.principal(secret)
    if principal is None:
        raise ApiError(401, "invalid or revoked API token", "invalid_api_key",
                       headers={"WWW-Authenticate": "Bearer"})
    if not grants(principal.scopes, needed):
        held = " ".join(sorted(principal.scopes))
        raise ApiError(403, f"this route needs scope {wanted}; token '{principal.name}' has "
                       f"'{held}'", "insufficient_scope")
    if principal.run is not None:
        _check_bound(principal.run, connection.path_params)
    connection.scope.setdefault("state", {})["agentd.principal"] = principal


def _check_bound(run: RunScope, params: dict[str, Any]) -> None:
    for name in BOUND_PARAMS:
        value = params.get(name)
        if value is not None and not run.owns(name, str(value)):
            raise run.refusal(name, str(value))


def run_program(principal: Principal | None, program_id: str | None, program_field: str,
                session_id: str | None, session_field: str) -> tuple[str | None, str | None]:
    """The (program, session) a gateway request may use. A run's token must name one of
    its run's programs and may name only its run's session (the default, so that the
    programs its sandbox creates land there); any other token gets what it asked for."""
    run = None if principal is None else principal.run
    if run is None:
        return program_id, session_id
    if program_id is None or not run.owns_program(program_id):
        raise run.refusal("program_id", program_id, program_field)
    if session_id is not None and session_id != run.session_id:
        raise run.refusal("session_id", session_id, session_field)
    return program_id, run.session_id
