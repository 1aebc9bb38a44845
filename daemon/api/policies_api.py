"""Scheduling policies over REST: stored versions, validation, activation, rollback."""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
from litestar import Controller, Litestar, Request, get, post, put

from daemon.access.auth import OPERATOR, READ, principal_of
from daemon.api.errors import decode_body
from daemon.errors import ApiError
from daemon.policies.registry import PolicyService

MAX_SOURCE_CHARS = 200_000


class PutBody(msgspec.Struct, forbid_unknown_fields=True):
    source: str
    layer: str = "kv"


MAX_VERSION = 2**31 - 1  # beyond what the store's INTEGER column holds


class VersionBody(msgspec.Struct, forbid_unknown_fields=True):
    version: Annotated[int, msgspec.Meta(ge=1, le=MAX_VERSION)] | None = None


def _checked(version: int, param: str = "version") -> int:
    if not 1 <= version <= MAX_VERSION:
        raise ApiError(404, f"no version {version}", "not_found", param=param)
    return version


def service(request: Request[Any, Any, Any]) -> PolicyService:
    svc = request.app.state.get("policies")
    if svc is None:
        raise ApiError(503, "the policy registry has not started", "not_ready")
    assert isinstance(svc, PolicyService)
    return svc


def _who(request: Request[Any, Any, Any]) -> str:
    principal = principal_of(request)
    return principal.name if principal is not None else "operator"


async def _version(request: Request[Any, Any, Any]) -> int | None:
    body = await request.body()
    return decode_body(body, VersionBody).version if body.strip() else None


class PoliciesController(Controller):
    path = "/v1/policies"
    tags = ["policies"]

    @get("/", opt={"scope": READ}, summary="Stored policies and which one each layer runs")
    async def list_policies(self, request: Request[Any, Any, Any]) -> dict[str, Any]:
        return {"data": await service(request).list_policies()}

    @get("/{name:str}", opt={"scope": READ}, summary="One policy: versions, source, events")
    async def show(self, request: Request[Any, Any, Any], name: str) -> dict[str, Any]:
        return await service(request).get(name)

    @get("/{name:str}/versions", opt={"scope": READ}, summary="A policy's version history")
    async def versions(self, request: Request[Any, Any, Any], name: str) -> dict[str, Any]:
        return {"data": await service(request).versions(name)}

    @get("/{name:str}/versions/{version:int}", opt={"scope": READ},
         summary="One version with its source and validation report")
    async def version(self, request: Request[Any, Any, Any], name: str,
                      version: int) -> dict[str, Any]:
        return await service(request).version(name, _checked(version))

    @get("/{name:str}/diff", opt={"scope": READ}, summary="Unified diff between two versions")
    async def diff(self, request: Request[Any, Any, Any], name: str) -> dict[str, Any]:
        try:
            a, b = int(request.query_params["from"]), int(request.query_params["to"])
        except (KeyError, ValueError) as exc:
            raise ApiError(400, "diff needs integer query parameters from= and to=",
                           param="from") from exc
        return {"name": name, "from": a, "to": b, "diff": await service(request).diff(
            name, _checked(a, "from"), _checked(b, "to"))}

    @put("/{name:str}", status_code=201, opt={"scope": OPERATOR},
         summary="Store a new version (validated, not activated)")
    async def put_version(self, request: Request[Any, Any, Any], name: str) -> dict[str, Any]:
        body = decode_body(await request.body(), PutBody)
        if not body.source.strip() or len(body.source) > MAX_SOURCE_CHARS:
            raise ApiError(400, f"source must be 1..{MAX_SOURCE_CHARS} characters",
                           param="source")
        return await service(request).put(name, body.layer, body.source, _who(request))

    @post("/{name:str}/validate", status_code=200, opt={"scope": OPERATOR},
          summary="Validate a version (default: the latest) against the live snapshot")
    async def validate(self, request: Request[Any, Any, Any], name: str) -> dict[str, Any]:
        return await service(request).validate(name, await _version(request))

    @post("/{name:str}/activate", status_code=200, opt={"scope": OPERATOR},
          summary="Validate and swap in a version (default: the latest) between two ticks")
    async def activate(self, request: Request[Any, Any, Any], name: str) -> dict[str, Any]:
        return await service(request).activate(name, await _version(request), _who(request))

    @post("/{name:str}/rollback", status_code=200, opt={"scope": OPERATOR},
          summary="Put back the version that was active before this one")
    async def rollback(self, request: Request[Any, Any, Any], name: str) -> dict[str, Any]:
        return await service(request).rollback(name, _who(request))


def install_policies(app: Litestar) -> None:
    """Serve /v1/policies and start the registry once the daemon's core is up.

    Call in create_app after the Litestar app is built; idempotent. The startup hook
    runs after the daemon lifespan entered, so the core exists.
    """
    if app.state.get("policies_installed"):
        return
    app.state["policies_installed"] = True
    app.register(PoliciesController)

    async def start(app: Litestar) -> None:
        app.state["policies"] = await PolicyService.start(app.state["daemon"].get_core())

    app.on_startup.append(start)
