"""The published OpenAPI document describes the error bodies the API really sends.

Real 4xx answers of a running daemon (unknown id, bad query, missing token, missing
scope, bad body) are validated against the schema the document declares for that
operation and status.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx
import jsonschema
import pytest

from tests.daemon_process import DaemonProcess


def declared(doc: dict[str, Any], path: str, method: str, status: int) -> dict[str, Any]:
    """The response schema for `status`: the exact code, else its range (4XX), with the
    document's components beside it so that its $refs resolve."""
    responses = doc["paths"][path][method]["responses"]
    spec = responses.get(str(status)) or responses.get(f"{status // 100}XX")
    assert spec is not None, f"{method.upper()} {path} declares no {status}: {list(responses)}"
    return {**spec["content"]["application/json"]["schema"], "components": doc["components"]}


@pytest.fixture
def daemon(daemon_factory: Callable[..., DaemonProcess]) -> DaemonProcess:
    return daemon_factory(workers=1).start()


def test_real_4xx_bodies_validate_against_the_published_schema(daemon: DaemonProcess) -> None:
    d = daemon
    doc = d.get("/schema/openapi.json").json()
    made = d.cli("token", "create", "--scope", "read", "--name", "viewer")
    assert made.returncode == 0, made.stderr
    viewer = made.stdout.strip()
    cases = [  # (method, URL, template, token, body, expected status)
        ("get", "/v1/programs/nope", "/v1/programs/{program_id}", None, None, 404),
        ("get", "/v1/programs?limit=0", "/v1/programs", None, None, 400),
        ("get", "/v1/workers", "/v1/workers", "", None, 401),
        ("post", "/v1/programs/p/kill", "/v1/programs/{program_id}/kill", viewer, None, 403),
        ("put", "/v1/policies/x", "/v1/policies/{name}", None, {"source": ""}, 400),
        ("post", "/v1/policies/nope/validate", "/v1/policies/{name}/validate", None, None, 404),
        ("post", "/v1/runs", "/v1/runs", None, {"workflow": 5}, 400),
    ]
    for method, url, template, token, body, status in cases:
        headers = {} if token == "" else d.auth_headers(token)
        r = httpx.request(method.upper(), f"{d.url}{url}", headers=headers, json=body,
                          timeout=10)
        assert r.status_code == status, (url, r.status_code, r.text)
        schema = declared(doc, template, method, status)
        jsonschema.validate(r.json(), schema)  # raises with the mismatch if it does not fit
        # ...and the schema is not vacuous: Litestar's own error shape does not fit it.
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate({"status_code": status, "detail": "x", "extra": {}}, schema)
    assert '"status_code"' not in json.dumps(doc["paths"])
