"""Tokens against a real store (SQLite, PostgreSQL): hashing, revocation, the cache, the
first-start file."""

from __future__ import annotations

import asyncio
import json
import os
import stat
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from daemon.access import auth
from daemon.commands.cli import main
from daemon.config import Config, ConfigError, load
from db import tokens
from db.engine import make_engine, make_sessionmaker, upgrade
from db.models import ApiToken


@pytest.fixture
async def store(store_url: str) -> AsyncIterator[async_sessionmaker[AsyncSession]]:
    url = store_url
    await upgrade(url)
    engine = make_engine(url)
    yield make_sessionmaker(engine)
    await engine.dispose()


async def _issue(sessions: async_sessionmaker[AsyncSession], *scopes: str) -> tuple[str, str]:
    async with sessions() as s, s.begin():
        return await auth.issue_token(s, "t", scopes)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def test_only_the_hash_is_stored(store: async_sessionmaker[AsyncSession],
                                       tmp_path: Path) -> None:
    token_id, secret = await _issue(store, "read")
    assert secret.startswith("agd_") and len(secret) > 40
    async with store() as s:
        record = await tokens.find_by_hash(s, tokens.hash_secret(secret))
    assert record is not None and record.id == token_id and record.scopes == {"read"}
    async with store() as s:  # on either database: no column of any token holds it
        rows = (await s.execute(select(ApiToken.__table__))).all()
    assert rows and not any(secret in str(value) for row in rows for value in row)
    db_file = tmp_path / "agentd.db"
    if db_file.exists():  # SQLite: nor does any byte of the file
        assert secret.encode() not in db_file.read_bytes()


async def test_revocation_reaches_the_daemon_within_the_cache_ttl(
    store: async_sessionmaker[AsyncSession],
) -> None:
    clock = Clock()
    checker = auth.TokenAuth(enabled=True, ttl_s=1.0, clock=clock)
    checker.bind(store)
    token_id, secret = await _issue(store, "submit")
    principal = await checker.principal(secret)
    assert principal is not None and principal.token_id == token_id
    async with store() as s, s.begin():
        assert await tokens.revoke(s, token_id, 1.0) is not None
    clock.now += 0.5
    assert await checker.principal(secret) is not None  # still cached
    clock.now += 0.6
    assert await checker.principal(secret) is None
    clock.now += 5
    assert await checker.principal(secret) is None


class CountingSessions:
    """The store's session factory, counting the sessions (reads) opened."""

    def __init__(self, sessions: async_sessionmaker[AsyncSession]) -> None:
        self.sessions, self.opened = sessions, 0

    def __call__(self) -> AsyncSession:
        self.opened += 1
        return self.sessions()


def _counted(store: async_sessionmaker[AsyncSession],
             ) -> tuple[Clock, CountingSessions, auth.TokenAuth]:
    """A checker with a 1 s TTL on a fake clock, reading `store` through a counter."""
    clock, counting = Clock(), CountingSessions(store)
    checker = auth.TokenAuth(enabled=True, ttl_s=1.0, clock=clock)
    checker.bind(counting)  # type: ignore[arg-type]
    return clock, counting, checker


async def test_an_expired_entry_is_read_once_however_many_requests_carry_it(
    store: async_sessionmaker[AsyncSession],
) -> None:
    clock, counting, checker = _counted(store)
    token_id, secret = await _issue(store, "submit")
    assert (await checker.principal(secret)) is not None and counting.opened == 1
    clock.now += 2  # expired: every request below would have read the store
    found = await asyncio.gather(*(checker.principal(secret) for _ in range(20)))
    assert all(p is not None and p.token_id == token_id for p in found)
    assert counting.opened == 2


async def test_a_half_old_entry_is_refreshed_in_the_background(
    store: async_sessionmaker[AsyncSession],
) -> None:
    clock, counting, checker = _counted(store)
    token_id, secret = await _issue(store, "submit")
    await checker.principal(secret)
    clock.now += 0.6  # past half the TTL: served from the cache, read again behind it
    assert (await checker.principal(secret)) is not None
    await asyncio.gather(*checker._lookups.values())  # the refresh behind the answer
    assert counting.opened == 2
    clock.now += 0.7  # past the first read's TTL, within the refresh's: no request waits
    principal = await checker.principal(secret)
    assert principal is not None and principal.token_id == token_id
    assert counting.opened == 2


async def test_a_new_token_works_at_once_and_guesses_are_not_cached(
    store: async_sessionmaker[AsyncSession],
) -> None:
    checker = auth.TokenAuth(enabled=True, clock=Clock())
    checker.bind(store)
    assert await checker.principal("agd_guess") is None
    _, secret = await _issue(store, "read")
    assert await checker.principal(secret) is not None
    assert len(checker._cache) == 1


async def test_revoke_is_idempotent_and_unknown_ids_are_reported(
    store: async_sessionmaker[AsyncSession],
) -> None:
    token_id, _ = await _issue(store, "read")
    async with store() as s, s.begin():
        first = await tokens.revoke(s, token_id, 10.0)
        again = await tokens.revoke(s, token_id, 20.0)
        missing = await tokens.revoke(s, "tok-nope", 30.0)
    assert first is not None and again is not None and missing is None
    assert first.revoked_at == again.revoked_at == 10.0


async def test_first_start_writes_a_private_operator_token_once(
    store: async_sessionmaker[AsyncSession], tmp_path: Path,
) -> None:
    config_dir = tmp_path / "cfg" / "agentd"
    old_umask = os.umask(0o022)  # a permissive umask must not widen the file
    try:
        path = await auth.ensure_first_token(store, config_dir)
    finally:
        os.umask(old_umask)
    assert path == config_dir / "token"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    secret = path.read_text()
    assert secret.endswith("\n") and secret.count("\n") == 1 and secret.startswith("agd_")
    checker = auth.TokenAuth(enabled=True)
    checker.bind(store)
    principal = await checker.principal(secret.strip())
    assert principal is not None and principal.scopes == {"operator"}
    assert await auth.ensure_first_token(store, config_dir) is None
    assert path.read_text() == secret
    assert sorted(p.name for p in config_dir.iterdir()) == ["token"]


def test_write_token_file_replaces_an_older_wider_file(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("old")
    path.chmod(0o644)
    auth.write_token_file(path, "agd_new")
    assert path.read_text() == "agd_new\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


# --- config -------------------------------------------------------------------------


@pytest.mark.parametrize("host", ["0.0.0.0", "10.1.2.3", "::", "agentd.example.com"])
def test_auth_off_on_a_reachable_host_is_refused(host: str) -> None:
    with pytest.raises(ConfigError, match="auth = false is only allowed on a loopback host"):
        load({"host": host}, env={"AGENTD_AUTH": "false"})


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "::1", "[::1]", "localhost"])
def test_auth_off_on_loopback_is_allowed(host: str) -> None:
    assert load({"host": host}, env={"AGENTD_AUTH": "false"}).auth is False


def test_config_dir_and_limits_come_from_the_environment(tmp_path: Path) -> None:
    cfg = load(env={"AGENTD_CONFIG_DIR": str(tmp_path), "AGENTD_RATE_LIMIT_RPS": "2.5",
                    "AGENTD_MAX_QUEUED_REQUESTS": "7"})
    assert cfg.config_path == tmp_path and cfg.rate_limit_rps == 2.5
    assert cfg.max_queued_requests == 7 and cfg.auth is True
    assert Config().config_path.name == "agentd"
    with pytest.raises(ConfigError, match="rate_limit_burst"):
        load(env={"AGENTD_RATE_LIMIT_BURST": "-1"})


# --- agentd token -------------------------------------------------------------------


def test_token_cli_create_list_revoke(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AGENTD_CONFIG", raising=False)
    monkeypatch.delenv("AGENTD_DB", raising=False)
    data = ["--data-dir", str(tmp_path)]
    assert main(["token", "create", "--scope", "read,submit", "--name", "ci", *data]) == 0
    out, err = capsys.readouterr()
    secret = out.strip()
    assert secret.startswith("agd_") and "shown only once" in err
    assert main(["token", "list", "--json", *data]) == 0
    [row] = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert row["name"] == "ci" and row["scopes"] == "read submit" and row["revoked_at"] is None
    assert secret not in json.dumps(row)
    assert main(["token", "revoke", row["id"], *data]) == 0
    assert row["id"] in capsys.readouterr().out
    assert main(["token", "list", *data]) == 0
    table = capsys.readouterr().out
    assert "revoked" in table and secret not in table
    assert main(["token", "revoke", "tok-missing", *data]) == 1
    assert "no token with id 'tok-missing'" in capsys.readouterr().err
    assert main(["token", "create", "--scope", "admin", "--name", "x", *data]) == 2
    assert "unknown scope(s) admin" in capsys.readouterr().err
