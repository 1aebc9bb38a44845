"""What a standby daemon answers while it waits for the store's lease: 503 to everything,
with a body that says so and a Retry-After, so that clients and load balancers go to the
active daemon. No route reads anything: there is nothing for a tenant to see here."""

from __future__ import annotations

from typing import Any

from litestar import Litestar, Request, Response, route

from daemon.api.errors import error_body

RETRY_AFTER_S = 2
METHODS: list[Any] = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"]
MESSAGE = ("this agentd is a standby: another daemon holds the store's lease and serves; "
           "this one takes over when that lease lapses")


@route(["/", "/{path:path}"], http_method=METHODS, include_in_schema=False)
async def standing_by(request: Request[Any, Any, Any]) -> Response[dict[str, Any]]:
    if request.url.path == "/healthz":  # a probe's answer: what it is, not an API error
        body: dict[str, Any] = {"status": "standby", "message": MESSAGE}
    else:
        body = error_body(503, MESSAGE, "standby")
    return Response(body, status_code=503, headers={"Retry-After": str(RETRY_AFTER_S)})


def standby_app() -> Litestar:
    return Litestar(route_handlers=[standing_by], openapi_config=None, debug=False,
                    logging_config=None)
