"""Every error leaves the API in OpenAI's shape: {"error": {message, type, param, code}}.

Exceptions are translated once, here; handlers raise ApiError (or CoreError from
the core) and never build error responses themselves. Unexpected exceptions are
logged with their traceback and answered with a generic 500 that leaks nothing.
`ErrorSchemaPlugin` publishes that same shape in the OpenAPI document.
"""

from __future__ import annotations

import logging
from array import array
from itertools import accumulate
from typing import Any, TypeVar

import msgspec
from litestar import Request, Response
from litestar.exceptions import HTTPException, ValidationException
from litestar.openapi.datastructures import ResponseSpec
from litestar.plugins import ReceiveRoutePlugin
from litestar.routes import BaseRoute, HTTPRoute

from daemon.errors import ApiError, CoreError
from daemon.policies.registry import PolicyError

log = logging.getLogger("agentd.api")
T = TypeVar("T")

_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
          404: "not_found_error", 409: "conflict_error", 413: "invalid_request_error",
          429: "rate_limit_error", 503: "service_unavailable"}


def error_body(status: int, message: str, code: str, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": _TYPES.get(status, "api_error"),
                      "param": param, "code": code}}


def _respond(status: int, message: str, code: str, param: str | None = None,
             headers: dict[str, str] | None = None) -> Response[Any]:
    return Response(error_body(status, message, code, param), status_code=status, headers=headers)


def api_error_handler(_: Request[Any, Any, Any], exc: ApiError) -> Response[Any]:
    return _respond(exc.status, exc.message, exc.code, exc.param, exc.headers)


def core_error_handler(_: Request[Any, Any, Any], exc: CoreError) -> Response[Any]:
    return _respond(exc.status, str(exc), exc.code)


def policy_error_handler(_: Request[Any, Any, Any], exc: PolicyError) -> Response[Any]:
    return _respond(exc.status, exc.message, exc.code, exc.param)


def http_error_handler(_: Request[Any, Any, Any], exc: HTTPException) -> Response[Any]:
    message = exc.detail
    if isinstance(exc, ValidationException) and exc.extra:
        message = f"{exc.detail}: {exc.extra}"
    code = {404: "not_found", 405: "method_not_allowed", 413: "body_too_large"}.get(
        exc.status_code, "invalid_request")
    if exc.status_code == 413:
        message = "request body is larger than the configured limit (max_body_bytes)"
    return _respond(exc.status_code, str(message), code)


def internal_error_handler(request: Request[Any, Any, Any], exc: Exception) -> Response[Any]:
    log.exception("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    return _respond(500, "internal error; the daemon log has the details", "internal_error")


EXCEPTION_HANDLERS: dict[Any, Any] = {
    ApiError: api_error_handler,
    CoreError: core_error_handler,
    PolicyError: policy_error_handler,
    HTTPException: http_error_handler,
    Exception: internal_error_handler,
}


# --- the published schema of every error ---------------------------------------------


class ErrorDetail(msgspec.Struct):
    message: str
    type: str
    param: str | None
    code: str


class ErrorBody(msgspec.Struct):
    """What every 4xx/5xx answer of the API carries (error_body above builds it)."""

    error: ErrorDetail


_ERROR = ResponseSpec(data_container=ErrorBody, generate_examples=False,
                      description="An error: {error: {message, type, param, code}}")


class ErrorSchemaPlugin(ReceiveRoutePlugin):
    """Declares ErrorBody for every error status of every documented operation.

    Without it Litestar documents its own {status_code, detail, extra} for validation
    failures (and nothing for the rest), which is not what the handlers above send.
    "4XX"/"5XX" are OpenAPI's status ranges; 400 is named too, to replace Litestar's
    own entry. A public route (a liveness probe) answers 503 with its own body, so only
    its 4xx are declared. Pass an instance in `Litestar(plugins=[...])`.
    """

    def receive_route(self, route: BaseRoute) -> None:
        if not isinstance(route, HTTPRoute):
            return
        from daemon.access.auth import PUBLIC, declared_scopes  # auth imports this module

        for handler in route.route_handlers:
            codes: list[Any] = [400, "4XX"]
            if PUBLIC not in (declared_scopes(handler) or ()):
                codes.append("5XX")
            handler.responses = {**dict.fromkeys(codes, _ERROR), **(handler.responses or {})}


# --- request bodies ------------------------------------------------------------------

# How deeply a request body may nest arrays and objects: ample for real JSON schemas,
# tool specs and run arguments, and far below where decoding (or any later walk of the
# value) would exhaust the interpreter's stack.
MAX_JSON_DEPTH = 64

_NOT_MARKS = bytes(b for b in range(256) if b not in b'[]{}"')
_DEPTH_STEPS = bytes.maketrans(b"[{]}", b"\x01\x01\xff\xff")  # +1 in, -1 (as int8) out
_SCAN_CHUNK = 1 << 16


def nests_too_deep(body: bytes) -> bool:
    """Whether a JSON text nests arrays and objects deeper than MAX_JSON_DEPTH (brackets
    in strings do not count). Checked on the bytes, before decoding, in steps that run in
    C; a body with no more opening brackets than the limit is not scanned at all."""
    if body.count(b"[") + body.count(b"{") <= MAX_JSON_DEPTH:
        return False
    return _exceeds_limit(_brackets_outside_strings(body))


def _brackets_outside_strings(body: bytes) -> bytes:
    # Without escaped backslashes, then escaped quotes, every quote opens or closes a string.
    unescaped = body.replace(b"\\\\", b"").replace(b'\\"', b"")
    # Brackets and quotes only; a string with no bracket in it is then "" and goes first.
    marks = unescaped.translate(None, _NOT_MARKS).replace(b'""', b"")
    return b"".join(marks.split(b'"')[::2])


def _exceeds_limit(brackets: bytes) -> bool:
    """Whether the running depth passes the limit, chunk by chunk: a deep body is found
    in its first chunk rather than after a walk of all of it."""
    depth = 0
    for start in range(0, len(brackets), _SCAN_CHUNK):
        steps = array("b", brackets[start:start + _SCAN_CHUNK].translate(_DEPTH_STEPS))
        if max(accumulate(steps, initial=depth)) > MAX_JSON_DEPTH:
            return True
        depth += sum(steps)
    return False


def decode_body(body: bytes, kind: type[T]) -> T:
    """Decode JSON into a struct; the error names the field that is wrong.

    Every JSON body the API reads comes through here, so the depth limit and the UTF-8
    check hold for all of them.
    """
    if not body:
        raise ApiError(400, "request body is empty; expected a JSON object", "invalid_json")
    if nests_too_deep(body):
        raise ApiError(400, f"JSON nests arrays and objects deeper than {MAX_JSON_DEPTH} "
                       "levels", "invalid_json")
    try:
        return msgspec.json.decode(body, type=kind)
    except msgspec.ValidationError as exc:
        text = str(exc)
        param = text.split("`$.", 1)[1].split("`", 1)[0] if "`$." in text else None
        raise ApiError(400, f"invalid request: {text}", "invalid_value", param) from exc
    except msgspec.DecodeError as exc:
        raise ApiError(400, f"malformed JSON: {exc}", "invalid_json") from exc
    except UnicodeDecodeError as exc:
        raise ApiError(400, f"request body is not valid UTF-8 ({exc.reason})",
                       "invalid_json") from exc
