"""The API reference, opened with the web UI's login: the daemon's OpenAPI document
(GET /schema/openapi.json, fetched with the logged-in user's token) as a page of
operations, and the document itself for download.

A browser cannot send the bearer header /schema/* asks for, and Swagger UI's scripts
would come from a CDN the UI's Content-Security-Policy (and an offline host) refuses, so
the UI renders the document itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from litestar import Response, get
from litestar.enums import MediaType

from webui.client import Api
from webui.web import Req, render, with_api

SCHEMA_PATH = "/schema/openapi.json"
METHODS = ("get", "post", "put", "patch", "delete")


@dataclass(frozen=True, slots=True)
class Field:
    name: str
    where: str  # path, query, header, body
    type: str
    required: bool
    description: str = ""


@dataclass(frozen=True, slots=True)
class Operation:
    method: str
    path: str
    summary: str
    description: str
    fields: list[Field] = field(default_factory=list)
    body: str = ""  # the request body's schema name
    responses: list[str] = field(default_factory=list)

    @property
    def anchor(self) -> str:
        path = self.path.strip("/").replace("/", "-")
        return f"{self.method}-{path}".replace("{", "").replace("}", "")


def operations(schema: dict[str, Any]) -> dict[str, list[Operation]]:
    """The document's operations, grouped by the path's first two segments (/v1/programs)."""
    components = schema.get("components", {}).get("schemas", {})
    groups: dict[str, list[Operation]] = {}
    for path, item in sorted(schema.get("paths", {}).items()):
        for method in METHODS:
            op = item.get(method)
            if op is None:
                continue
            group = "/".join(path.split("/")[:3])
            groups.setdefault(group, []).append(_operation(method, path, op, components))
    return groups


def _operation(method: str, path: str, op: dict[str, Any],
               components: dict[str, Any]) -> Operation:
    fields = [Field(p["name"], p.get("in", ""), _type_of(p.get("schema", {})),
                    bool(p.get("required")), p.get("description", ""))
              for p in op.get("parameters", [])]
    body = ""
    content = (op.get("requestBody") or {}).get("content", {})
    for media in content.values():
        ref = media.get("schema", {})
        body = _type_of(ref)
        fields.extend(_body_fields(_resolve(ref, components), components))
        break
    return Operation(method.upper(), path, op.get("summary", ""), op.get("description", ""),
                     fields, body, sorted(op.get("responses", {})))


def _resolve(schema: dict[str, Any], components: dict[str, Any]) -> dict[str, Any]:
    ref = schema.get("$ref", "")
    return components.get(ref.rsplit("/", 1)[-1], {}) if ref else schema


def _body_fields(schema: dict[str, Any], components: dict[str, Any]) -> list[Field]:
    required = set(schema.get("required", []))
    return [Field(name, "body", _type_of(prop), name in required,
                  _resolve(prop, components).get("description", prop.get("description", "")))
            for name, prop in schema.get("properties", {}).items()]


def _type_of(schema: dict[str, Any]) -> str:
    if "$ref" in schema:
        return str(schema["$ref"]).rsplit("/", 1)[-1]
    for key in ("oneOf", "anyOf"):
        if key in schema:
            return " | ".join(_type_of(s) for s in schema[key])
    kind = schema.get("type", "any")
    if isinstance(kind, list):
        return " | ".join(kind)
    if kind == "array":
        return f"array of {_type_of(schema.get('items', {}))}"
    return str(kind)


@get("/api", name="ui.api")
async def api_page(request: Req) -> Response[Any]:
    async def page(api: Api) -> Response[Any]:
        schema = await api.get(SCHEMA_PATH)
        info = schema.get("info", {})
        return render(request, "api.html", title="API", groups=operations(schema),
                      version=info.get("version", ""), openapi=schema.get("openapi", ""))

    return await with_api(request, page)


@get("/api/openapi.json", name="ui.api_document")
async def api_document(request: Req) -> Response[Any]:
    async def document(api: Api) -> Response[Any]:
        return Response(await api.text(SCHEMA_PATH), media_type=MediaType.JSON)

    return await with_api(request, document)
