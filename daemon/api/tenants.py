"""The tenant a gateway request runs as; the rules are in daemon/tenancy.py."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from daemon.api.errors import ApiError
from daemon.auth import OPERATOR, Principal, principal_of
from daemon.tenant_names import DEFAULT_TENANT, tenant_problem

if TYPE_CHECKING:
    from litestar import Request

    from daemon.core import Core

TENANT_HEADER = "X-Tenant"
TENANT_FIELD = "tenant"


async def request_tenant(request: Request[Any, Any, Any], core: Core,
                         body_tenant: str | None) -> str:
    """The tenant a gateway request runs as (rules: daemon/tenancy.py)."""
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
    if principal.run is not None:
        return await core.slo.tenants.of(principal.run.session_id) or DEFAULT_TENANT
    return token_tenant(principal)


def token_tenant(principal: Principal) -> str:
    return principal.tenant or principal.token_id
