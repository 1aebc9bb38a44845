"""Tokens, scopes and limits against real daemons started with `agentd start`."""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from daemon.access import auth
from daemon.app import create_app
from daemon.config import Config
from tests.daemon_process import DaemonProcess
from tests.waiting import wait_for

MODEL = "sim-llama3-8b"


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    d = DaemonProcess(data_dir=tmp_path_factory.mktemp("auth") / "data")
    d.start()
    yield d
    d.stop()


def _create(d: DaemonProcess, scope: str, name: str) -> tuple[str, str]:
    """(id, secret) of a new token, made with the CLI while the daemon runs."""
    done = d.cli("token", "create", "--scope", scope, "--name", name)
    assert done.returncode == 0, done.stderr
    token_id = re.search(r"created token (tok-\w+)", done.stderr)
    assert token_id is not None
    return token_id.group(1), done.stdout.strip()


def _chat(d: DaemonProcess, token: str, content: str = "hi", **extra: object) -> httpx.Response:
    body = {"model": MODEL, "messages": [{"role": "user", "content": content}],
            "max_tokens": 2, **extra}
    return httpx.post(f"{d.url}/v1/chat/completions", json=body, timeout=30,
                      headers={"Authorization": f"Bearer {token}"})


def test_first_start_token_file_is_private_and_is_the_only_token(daemon: DaemonProcess) -> None:
    assert stat.S_IMODE(daemon.token_path.stat().st_mode) == 0o600
    assert re.fullmatch(r"agd_[\w-]{40,}\n", daemon.token_path.read_text())
    listed = daemon.cli("token", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    first = listed.stdout.splitlines()[0]
    assert '"scopes": "operator"' in first and "first start" in first
    assert daemon.token not in listed.stdout


def _routes() -> list[tuple[str, str, tuple[str, ...]]]:
    """Every route the daemon serves, from the same app factory, with its declared scope."""
    out = []
    for method, path, handler in auth.iter_routes(create_app(Config())):
        scopes = auth.declared_scopes(handler)
        assert scopes is not None
        out.append((method, _concrete(path), scopes))
    return out


def _concrete(path: str) -> str:
    """A request path for a route template: ints for int parameters, 'x' for the rest."""
    return re.sub(r"\{[^}]+\}", "x", re.sub(r"\{[^}:]+:int\}", "1", path))


def test_every_route_enforces_its_scope(daemon: DaemonProcess) -> None:
    tokens = {"read": _create(daemon, "read", "r")[1], "submit": _create(daemon, "submit", "s")[1],
              "operator": daemon.token}
    live_paths = daemon.get("/schema/openapi.json").json()["paths"]
    routes = _routes()
    # The OpenAPI paths drop parameter types, so compare templates with every value as 'x'.
    def shape(path: str) -> str:
        return re.sub(r"/1(?=/|$)", "/x", _concrete(path))

    assert {shape(p) for p in live_paths} <= {shape(p) for _, p, _ in routes}
    with httpx.Client(base_url=daemon.url, timeout=30) as client:
        for method, path, needed in routes:
            where = f"{method} {path} needs {needed}"
            if path.startswith("/ui"):
                continue  # the web UI's own login guards it; tests/ui covers it
            if auth.PUBLIC in needed:
                assert client.request(method, path).status_code == 200, where
                continue
            for headers in ({}, {"Authorization": "Bearer agd_not-a-token"},
                            {"Authorization": f"Basic {daemon.token}"}):
                resp = client.request(method, path, headers=headers, json={})
                assert resp.status_code == 401, (where, headers, resp.text)
                assert resp.json()["error"]["type"] == "authentication_error"
            for held, secret in tokens.items():
                if path == "/v1/admin/drain" and auth.grants(frozenset({held}), needed):
                    continue  # granted, it would stop the daemon; test_drain covers it
                resp = client.request(method, path, json={},
                                      headers={"Authorization": f"Bearer {secret}"})
                if auth.grants(frozenset({held}), needed):
                    assert resp.status_code not in (401, 403), (where, held, resp.text)
                else:
                    assert resp.status_code == 403, (where, held, resp.text)
                    err = resp.json()["error"]
                    assert err["type"] == "permission_error"
                    assert all(f"'{s}'" in err["message"] for s in needed), err


def test_openai_client_sends_its_api_key_as_the_token(daemon: DaemonProcess) -> None:
    _, secret = _create(daemon, "submit", "openai-client")
    client = openai.OpenAI(base_url=f"{daemon.url}/v1", api_key=secret, max_retries=0)
    assert [m.id for m in client.models.list()] == [MODEL]
    resp = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hello"}], max_tokens=3)
    assert resp.usage is not None and resp.usage.completion_tokens == 3
    bad = openai.OpenAI(base_url=f"{daemon.url}/v1", api_key="agd_wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError, match="invalid or revoked"):
        bad.models.list()


def test_revocation_takes_effect_while_the_daemon_runs(daemon: DaemonProcess) -> None:
    token_id, secret = _create(daemon, "submit", "to-revoke")
    assert _chat(daemon, secret).status_code == 200
    revoked = daemon.cli("token", "revoke", token_id)
    assert revoked.returncode == 0, revoked.stderr
    since = time.monotonic()
    wait_for(lambda: _chat(daemon, secret).status_code == 401, auth.CACHE_TTL_S + 1.0,
             "the revocation to take effect", interval=0.05)
    assert time.monotonic() - since <= auth.CACHE_TTL_S + 0.5
    resp = _chat(daemon, secret)
    assert resp.status_code == 401 and resp.json()["error"]["code"] == "invalid_api_key"
    assert _chat(daemon, daemon.token).status_code == 200  # other tokens are untouched


def test_rate_limit_answers_429_with_retry_after(daemon_factory) -> None:  # type: ignore[no-untyped-def]
    d: DaemonProcess = daemon_factory(env={
        "AGENTD_RATE_LIMIT_RPS": "0.2", "AGENTD_RATE_LIMIT_BURST": "2",
        "AGENTD_MAX_PROMPT_CHARS": "200"}).start()
    _, first = _create(d, "submit", "tenant-a")
    _, second = _create(d, "submit", "tenant-b")
    assert _chat(d, first).status_code == 200
    assert _chat(d, first).status_code == 200
    limited = _chat(d, first, program_id="p-limited")
    assert limited.status_code == 429, limited.text
    assert 1 <= int(limited.headers["Retry-After"]) <= 5
    err = limited.json()["error"]
    assert err["type"] == "rate_limit_error" and err["code"] == "rate_limited"
    assert "rate_limit_rps" in err["message"]
    assert _chat(d, second).status_code == 200  # each token has its own bucket
    too_long = _chat(d, second, content="x" * 201, program_id="p-too-long")
    assert too_long.status_code == 400 and too_long.json()["error"]["code"] == "prompt_too_long"
    # Refused requests leave nothing behind: no program, no request, no session.
    for pid in ("p-limited", "p-too-long"):
        assert d.get(f"/v1/programs/{pid}").status_code == 404
        assert d.get(f"/v1/sessions/{pid}").status_code == 404


def test_auth_off_is_refused_on_a_reachable_host(tmp_path: Path) -> None:
    env = {**os.environ, "AGENTD_AUTH": "false", "AGENTD_CONFIG_DIR": str(tmp_path / "cfg")}
    done = subprocess.run(
        [sys.executable, "-m", "daemon.commands.cli", "start", "--host", "0.0.0.0", "--port", "0",
         "--data-dir", str(tmp_path / "data"), "--workers", "0"],
        env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "only allowed on a loopback host" in done.stderr
    assert not (tmp_path / "data").exists() and not (tmp_path / "cfg").exists()


def test_auth_off_on_loopback_serves_without_tokens(daemon_factory) -> None:  # type: ignore[no-untyped-def]
    d: DaemonProcess = daemon_factory(workers=0, env={"AGENTD_AUTH": "false"}).start()
    assert httpx.get(f"{d.url}/v1/programs", timeout=10).status_code == 200
    assert not d.token_path.exists()
