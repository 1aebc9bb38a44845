"""The tenancy rule at the API boundary, in one place (the scheduling side of tenants is
daemon/core/tenants.py).

Who a request runs as (`request_tenant`): its token's tenant, or the tenant an operator
names; a run's token runs as its run's session's tenant.

What a request may see and act on (`Access`): an operator token, or any caller while auth
is off, sees everything. Any other token sees and acts on its own tenant's objects only:
the sessions that record its tenant and everything that belongs to them (their programs,
runs, managed state, tools and traces), and its tenant's workflows (workflow names are
per tenant). Another tenant's object answers exactly as an unknown id does (404), so a
tenant learns nothing of what others hold through the REST API. One caveat is stated in
docs/threat-model.md: ids are global, so the gateway, which creates the program or
session a request names, refuses an id another tenant holds (404) where it would create
an unused one.

Where the rule is applied, so that a new endpoint cannot miss it:
- `require_owner`, a guard on every route after the scope guard, checks each path
  parameter that names an object (`program_id`, `session_id`, `run_id`, `response_id`,
  `request_id`);
- routes that name objects in a body or header check them with `check_program` /
  `check_session` / `check_response` (the gateway, a run's session, a response's
  `previous_response_id`);
- routes that list objects filter with `Access.tenant` (sessions, programs, runs, tools,
  workflows, the scheduler's per-tenant figures).
`tests/integration/test_tenant_isolation.py` walks every route with two tenants' tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from litestar.connection import ASGIConnection
from litestar.handlers import BaseRouteHandler
from sqlalchemy import select

from daemon.access.auth import OPERATOR, Principal, principal_of
from daemon.access.names import DEFAULT_TENANT, tenant_problem
from daemon.errors import ApiError
from daemon.runtime import run_records
from db import models

if TYPE_CHECKING:
    from litestar import Request

    from daemon.core.core import Core

TENANT_HEADER = "X-Tenant"
TENANT_FIELD = "tenant"
_ACCESS = "agentd.access"
# The app-state key of the run controller (daemon/api/workflows_api.STATE_KEY; not
# imported, as that module imports this one).
_RUNS = "agentd.runs"


@dataclass(frozen=True, slots=True)
class Access:
    """What a request may see: `tenant` None is everything (an operator, or auth off)."""

    tenant: str | None

    def allows(self, owner: str | None) -> bool:
        """Whether an object owned by `owner` is visible; None: no such object (yet)."""
        return self.tenant is None or owner is None or owner == self.tenant


EVERYTHING = Access(None)


async def request_tenant(request: Request[Any, Any, Any], core: Core,
                         body_tenant: str | None) -> str:
    """The tenant a request runs as (rules: daemon/core/tenants.py's docstring)."""
    field, explicit = TENANT_FIELD, body_tenant
    if explicit is None and TENANT_HEADER.lower() in request.headers:
        field, explicit = TENANT_HEADER, request.headers[TENANT_HEADER.lower()]
    principal = principal_of(request)
    if explicit is not None:
        problem = tenant_problem(explicit)
        if problem is not None:
            raise ApiError(400, f"{field}: {problem}", param=field)
        if principal is not None and OPERATOR not in principal.scopes:
            raise ApiError(403, f"{field}: only an operator token may name the tenant; token "
                           f"'{principal.name}' runs as tenant '{token_tenant(principal)}'",
                           "tenant_not_allowed", param=field)
        return explicit
    if principal is None:
        return DEFAULT_TENANT
    return await _own_tenant(core, principal)


def token_tenant(principal: Principal) -> str:
    return principal.tenant or principal.token_id


async def _own_tenant(core: Core, principal: Principal) -> str:
    if principal.run is not None:
        return await core.slo.tenants.of(principal.run.session_id) or DEFAULT_TENANT
    return token_tenant(principal)


def access_of(connection: ASGIConnection[Any, Any, Any, Any]) -> Access:
    """The request's access, as `require_owner` resolved it."""
    value = connection.scope.get("state", {}).get(_ACCESS)
    return value if isinstance(value, Access) else EVERYTHING


# --- owners -------------------------------------------------------------------------


async def session_owner(core: Core, session_id: str) -> str | None:
    return await core.slo.tenants.of(session_id)


async def program_owner(core: Core, program_id: str) -> str | None:
    live = core.programs.get(program_id)
    session_id = live.session_id if live is not None else None
    if session_id is None:
        async with core.sessions() as s:
            session_id = await s.scalar(select(models.Program.session_id)
                                        .where(models.Program.id == program_id))
    return None if session_id is None else await session_owner(core, session_id)


async def run_owner(connection: ASGIConnection[Any, Any, Any, Any], core: Core,
                    run_id: str) -> str | None:
    """A run belongs to the tenant of the session it runs in (live or on record)."""
    runs = connection.app.state.get(_RUNS)
    if runs is None:
        return None
    run = runs.runs.get(run_id)
    if run is not None:
        return await session_owner(core, run.session_id)
    view = await run_records.recorded(runs.records, run_id)
    return None if view is None else await session_owner(core, str(view["session_id"]))


async def response_owner(core: Core, response_id: str) -> str | None:
    """A stored response belongs to the tenant that created it."""
    async with core.sessions() as s:
        owner: str | None = await s.scalar(select(models.Response.tenant)
                                           .where(models.Response.id == response_id))
    return owner


async def request_owner(core: Core, request_id: str) -> str | None:
    """A request belongs to the tenant of the session it was made in."""
    await core.writer.flush()  # a request may be newer than the last flush
    async with core.sessions() as s:
        session_id = await s.scalar(select(models.Request.session_id)
                                    .where(models.Request.id == request_id))
    return None if session_id is None else await session_owner(core, session_id)


async def session_owners(core: Core, session_ids: set[str]) -> dict[str, str]:
    """Tenant by session id for many sessions in one read (unknown ones are left out)."""
    if not session_ids:
        return {}
    await core.writer.flush()
    async with core.sessions() as s:
        rows = await s.execute(select(models.Session.id, models.Session.tenant)
                               .where(models.Session.id.in_(session_ids)))
        return {sid: tenant for sid, tenant in rows}


async def program_owners(core: Core, program_ids: set[str]) -> dict[str, str]:
    """Tenant by program id for many programs in one read (unknown ones are left out)."""
    if not program_ids:
        return {}
    await core.writer.flush()
    async with core.sessions() as s:
        rows = await s.execute(
            select(models.Program.id, models.Session.tenant)
            .join(models.Session, models.Session.id == models.Program.session_id)
            .where(models.Program.id.in_(program_ids)))
        return {pid: tenant for pid, tenant in rows}


# --- the checks ---------------------------------------------------------------------


def _unknown(what: str, value: str, param: str) -> ApiError:
    return ApiError(404, f"unknown {what} '{value}'", "not_found", param=param)


async def check_program(core: Core, access: Access, program_id: str | None,
                        field: str = "program_id") -> None:
    """404 for a program of another tenant (`field`: where the request named it)."""
    if program_id is not None and access.tenant is not None \
            and not access.allows(await program_owner(core, program_id)):
        raise _unknown("program", program_id, field)


async def check_session(core: Core, access: Access, session_id: str | None,
                        field: str = "session_id") -> None:
    """404 for a session of another tenant (`field`: where the request named it)."""
    if session_id is not None and access.tenant is not None \
            and not access.allows(await session_owner(core, session_id)):
        raise _unknown("session", session_id, field)


async def check_response(core: Core, access: Access, response_id: str | None,
                         field: str = "response_id") -> None:
    """404 for a response of another tenant (`field`: where the request named it)."""
    if response_id is not None and access.tenant is not None \
            and not access.allows(await response_owner(core, response_id)):
        raise _unknown("response", response_id, field)


async def require_owner(connection: ASGIConnection[Any, Any, Any, Any],
                        _handler: BaseRouteHandler) -> None:
    """The guard after `auth.require_scope`: resolves the request's access and refuses
    (404) a path parameter that names another tenant's program, session, run, response
    or request."""
    principal = principal_of(connection)
    if principal is None or OPERATOR in principal.scopes:
        return  # auth off, a public route, or an operator: everything
    core: Core = connection.app.state["daemon"].get_core()
    access = Access(await _own_tenant(core, principal))
    connection.scope.setdefault("state", {})[_ACCESS] = access
    params = connection.path_params
    await check_program(core, access, params.get("program_id"))
    await check_session(core, access, params.get("session_id"))
    await check_response(core, access, params.get("response_id"))
    run_id = params.get("run_id")
    if run_id is not None and not access.allows(await run_owner(connection, core, run_id)):
        raise _unknown("run", run_id, "run_id")
    request_id = params.get("request_id")
    if request_id is not None and not access.allows(await request_owner(core, request_id)):
        raise _unknown("request", request_id, "request_id")
