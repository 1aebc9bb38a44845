"""Who the caller's token is and what it may do: the consoles show only the actions a
token's scopes allow (a read-only token sees no buttons; the API refuses them anyway)."""

from __future__ import annotations

from typing import Any

from litestar import Controller, Request, get

from daemon.access.auth import OPERATOR, READ, SCOPES, SUBMIT, principal_of
from daemon.api.tenants import access_of


class WhoamiController(Controller):
    path = "/v1"
    tags = ["agentd"]

    @get("/whoami", opt={"scope": (READ, SUBMIT)},
         summary="The calling token: its name, scopes and tenant")
    async def whoami(self, request: Request[Any, Any, Any]) -> dict[str, Any]:
        principal = principal_of(request)
        if principal is None:  # auth is off: every caller may do everything
            return {"name": None, "scopes": list(SCOPES), "tenant": None}
        # An operator token includes every scope (auth.grants); say so, so that a client
        # needs no copy of that rule.
        held = SCOPES if OPERATOR in principal.scopes else sorted(principal.scopes)
        return {"name": principal.name, "scopes": list(held),
                "tenant": access_of(request).tenant}
