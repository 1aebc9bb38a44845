"""A run's token is bound to its run: the rule (`RunScope`, `run_program`) and the guard
that applies it to every route naming a program, session or run, against a real store."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from litestar import Litestar, get, post
from litestar.datastructures import State
from litestar.testing import AsyncTestClient
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from daemon.access import auth
from daemon.api.errors import EXCEPTION_HANDLERS
from daemon.errors import ApiError
from db.engine import make_engine, make_sessionmaker, sqlite_url, upgrade

RUN = auth.RunScope("run-0123456789abcdef", "prog-aaaa", "s-run")


@pytest.mark.parametrize(("program", "owned"), [
    ("prog-aaaa", True), ("prog-aaaa.Planner.0", True), ("prog-aaaa.agentd_3", True),
    ("prog-aaaab", False), ("prog-aaa", False), ("prog-bbbb", False), ("x.prog-aaaa", False),
])
def test_a_run_owns_its_program_and_the_programs_named_under_it(program: str,
                                                                owned: bool) -> None:
    assert RUN.owns_program(program) is owned
    assert RUN.owns("program_id", program) is owned


def test_sessions_and_runs_are_owned_by_name() -> None:
    assert RUN.owns("session_id", "s-run") and not RUN.owns("session_id", "s-other")
    assert RUN.owns("run_id", RUN.run_id) and not RUN.owns("run_id", "run-ffffffffffffffff")


def _principal(run: auth.RunScope | None) -> auth.Principal:
    return auth.Principal("tok-1", "t", frozenset({auth.SUBMIT}), run)


def test_other_tokens_use_the_gateway_as_they_ask() -> None:
    assert auth.run_program(None, None, "program_id", None, "session_id") == (None, None)
    assert auth.run_program(_principal(None), "anything", "program_id", "s-x",
                            "session_id") == ("anything", "s-x")


def test_a_run_token_gets_its_own_programs_in_its_own_session() -> None:
    bound = _principal(RUN)
    assert auth.run_program(bound, "prog-aaaa.Helper.0", "program_id", None,
                            "session_id") == ("prog-aaaa.Helper.0", "s-run")
    assert auth.run_program(bound, "prog-aaaa", "program_id", "s-run",
                            "session_id") == ("prog-aaaa", "s-run")


@pytest.mark.parametrize(("program", "session", "field"), [
    ("prog-victim", None, "program_id"),
    (None, None, "program_id"),
    ("prog-victim", None, "X-Program-Id"),
    ("prog-aaaa", "s-victim", "session_id"),
    ("prog-aaaa", "s-victim", "X-Session-Id"),
])
def test_a_run_token_is_refused_what_is_not_its_runs(program: str | None, session: str | None,
                                                      field: str) -> None:
    program_field = field if "rogram" in field else "program_id"
    session_field = field if "ession" in field else "session_id"
    with pytest.raises(ApiError) as caught:
        auth.run_program(_principal(RUN), program, program_field, session, session_field)
    err = caught.value
    assert (err.status, err.code, err.param) == (403, "run_token", field)
    assert err.message.startswith(f"{field}: run {RUN.run_id}'s token may act only on its own")


# --- the guard, with tokens in a real store ------------------------------------------


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[async_sessionmaker[AsyncSession]]:
    url = sqlite_url(tmp_path / "agentd.db")
    await upgrade(url)
    engine = make_engine(url)
    yield make_sessionmaker(engine)
    await engine.dispose()


@post("/v1/programs/{program_id:str}/release", opt={"scope": auth.SUBMIT}, status_code=200,
      sync_to_thread=False)
def release(program_id: str) -> dict[str, str]:
    return {"released": program_id}


@get("/v1/sessions/{session_id:str}/things", opt={"scope": auth.SUBMIT}, sync_to_thread=False)
def things(session_id: str) -> dict[str, str]:
    return {"session": session_id}


@get("/v1/runs/{run_id:str}/state", opt={"scope": auth.SUBMIT}, sync_to_thread=False)
def state(run_id: str) -> dict[str, str]:
    return {"run": run_id}


async def _issue(sessions: async_sessionmaker[AsyncSession], name: str) -> tuple[str, str]:
    async with sessions() as s, s.begin():
        return await auth.issue_token(s, name, {auth.SUBMIT})


async def test_the_guard_keeps_a_run_token_on_its_own_run(
        store: async_sessionmaker[AsyncSession]) -> None:
    token_auth = auth.TokenAuth(enabled=True)
    token_auth.bind(store)
    run_token, run_secret = await _issue(store, f"run {RUN.run_id}")
    _, client_secret = await _issue(store, "a client")
    token_auth.bind_run(run_token, RUN)
    app = Litestar(route_handlers=[release, things, state], guards=[auth.require_scope],
                   exception_handlers=EXCEPTION_HANDLERS, openapi_config=None,
                   state=State({"auth": token_auth}))
    as_run = {"Authorization": f"Bearer {run_secret}"}
    as_client = {"Authorization": f"Bearer {client_secret}"}
    async with AsyncTestClient(app) as client:
        for path in ("/v1/programs/prog-aaaa/release", "/v1/programs/prog-aaaa.Planner.0/release"):
            assert (await client.post(path, headers=as_run)).status_code == 200
        refused = [
            (await client.post("/v1/programs/prog-victim/release", headers=as_run), "program_id"),
            (await client.get("/v1/sessions/s-victim/things", headers=as_run), "session_id"),
            (await client.get("/v1/runs/run-ffffffffffffffff/state", headers=as_run), "run_id"),
        ]
        for resp, param in refused:
            assert resp.status_code == 403, resp.text
            err = resp.json()["error"]
            assert (err["code"], err["param"]) == ("run_token", param)
            assert err["message"].startswith(f"{param}: run {RUN.run_id}'s token")
        assert (await client.get("/v1/sessions/s-run/things", headers=as_run)).status_code == 200
        assert (await client.get(f"/v1/runs/{RUN.run_id}/state",
                                 headers=as_run)).status_code == 200
        # an ordinary submit token is not bound
        resp = await client.post("/v1/programs/prog-victim/release", headers=as_client)
        assert resp.status_code == 200
        # the run ends: its token is refused at once, even before the store says revoked
        token_auth.unbind_run(run_token)
        resp = await client.post("/v1/programs/prog-aaaa/release", headers=as_run)
        assert resp.status_code == 401
