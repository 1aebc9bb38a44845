"""Scope declarations and the guard: every route is declared, undeclared ones are refused."""

from __future__ import annotations

import re
from typing import Any

import pytest
from litestar import Litestar, get
from litestar.datastructures import State
from litestar.testing import TestClient

from daemon.access import auth
from daemon.api.errors import EXCEPTION_HANDLERS
from daemon.app import create_app
from daemon.config import Config


def test_parse_scopes_accepts_commas_and_spaces() -> None:
    assert auth.parse_scopes("read,submit") == {"read", "submit"}
    assert auth.parse_scopes(" operator ") == {"operator"}
    with pytest.raises(ValueError, match="admin"):
        auth.parse_scopes("read,admin")
    with pytest.raises(ValueError):
        auth.parse_scopes(" , ")


@pytest.mark.parametrize(("held", "needed", "ok"), [
    ({"read"}, ("read",), True),
    ({"read"}, ("submit",), False),
    ({"submit"}, ("read",), False),
    ({"submit"}, ("read", "submit"), True),
    ({"operator"}, ("read",), True),
    ({"operator"}, ("submit",), True),
    ({"read", "submit"}, ("operator",), False),
])
def test_operator_implies_the_others_and_nothing_else_does(
    held: set[str], needed: tuple[str, ...], ok: bool
) -> None:
    assert auth.grants(frozenset(held), needed) is ok


@pytest.mark.parametrize(("header", "secret"), [
    ("Bearer agd_abc", "agd_abc"), ("bearer   agd_abc ", "agd_abc"), (None, None), ("", None),
    ("Bearer ", None), ("Basic dXNlcjpwYXNz", None), ("agd_abc", None),
])
def test_bearer_parsing(header: str | None, secret: str | None) -> None:
    assert auth.bearer(header) == secret


def test_every_route_of_the_daemon_declares_a_known_scope() -> None:
    app = create_app(Config())
    routes = list(auth.iter_routes(app))
    assert len(routes) > 20  # the walk really sees the controllers and the schema router
    undeclared = [(m, p) for m, p, h in routes if auth.declared_scopes(h) is None]
    assert undeclared == []
    known = {*auth.SCOPES, auth.PUBLIC}
    for method, path, handler in routes:
        scopes = auth.declared_scopes(handler)
        assert scopes is not None and set(scopes) <= known, (method, path, scopes)
    # Public: the liveness probe, and the web UI, which logs its users in with a session
    # and calls the API with their token (so the API still checks every scope).
    public = {(m, p) for m, p, h in routes if auth.PUBLIC in (auth.declared_scopes(h) or ())}
    assert ("GET", "/healthz") in public
    assert {p for _, p in public if not p.startswith("/ui")} == {"/healthz"}


def _app(enabled: bool, *handlers: Any) -> Litestar:
    return Litestar(route_handlers=list(handlers), guards=[auth.require_scope],
                    exception_handlers=EXCEPTION_HANDLERS, openapi_config=None,
                    state=State({"auth": auth.TokenAuth(enabled=enabled)}))


@get("/undeclared", sync_to_thread=False)
def undeclared() -> str:
    return "should never be served"


@get("/declared", opt={"scope": auth.READ}, sync_to_thread=False)
def declared() -> str:
    return "ok"


@pytest.mark.parametrize("enabled", [True, False])
def test_a_route_without_a_scope_is_refused_even_with_auth_off(enabled: bool) -> None:
    with TestClient(_app(enabled, undeclared, declared)) as client:
        resp = client.get("/undeclared", headers={"Authorization": "Bearer agd_whatever"})
        assert resp.status_code == 403
        assert resp.json()["error"]["code"] == "scope_undeclared"
        assert resp.json()["error"]["type"] == "permission_error"
        assert client.get("/declared").status_code == (401 if enabled else 200)


def test_missing_token_answers_401_in_openai_shape_naming_the_scope() -> None:
    with TestClient(_app(True, declared)) as client:
        resp = client.get("/declared")
    assert resp.status_code == 401
    assert resp.headers["www-authenticate"] == "Bearer"
    err = resp.json()["error"]
    assert err["type"] == "authentication_error" and err["code"] == "missing_api_key"
    assert "'read'" in err["message"]




# What changes scheduling or other people's programs is the operator's (README, Security).
OPERATOR_ONLY = (r"/programs/[^/]+/(kill|migrate|pause|resume)$", r"/sessions/[^/]+/migrate$",
                 r"^/v1/policies", r"^/v1/tools/gc$", r"^/v1/admin/")
MUTATING = {"POST", "PUT", "PATCH", "DELETE"}


def test_no_read_token_can_change_anything_and_scheduling_is_the_operators() -> None:
    routes = [(m, p, auth.declared_scopes(h) or ())
              for m, p, h in auth.iter_routes(create_app(Config()))]
    mutating = [(m, p, s) for m, p, s in routes if m in MUTATING and p.startswith("/v1/")]
    assert len(mutating) > 15
    for method, path, scopes in mutating:
        assert not auth.grants(frozenset({auth.READ}), scopes), (method, path, scopes)
        assert auth.PUBLIC not in scopes, (method, path)
        if any(re.search(pattern, path) for pattern in OPERATOR_ONLY):
            assert scopes == (auth.OPERATOR,), (method, path, scopes)
    operator_routes = {p for m, p, s in mutating if s == (auth.OPERATOR,)}
    for pattern in OPERATOR_ONLY:  # each pattern still names a real route
        assert any(re.search(pattern, p) for p in operator_routes), pattern
