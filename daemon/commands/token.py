"""`agentd token create | list | revoke`: API tokens, written straight to the store.

The store is found the way `agentd start` finds it (flags > env > TOML > defaults) and
can be used while the daemon runs: SQLite is in WAL mode, and the daemon sees a
revocation within auth.CACHE_TTL_S.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from sqlalchemy.ext.asyncio import AsyncSession

T = TypeVar("T")


def add_token_parser(subparsers: Any) -> None:
    t = subparsers.add_parser("token", help="create, list and revoke API tokens")
    tsub = t.add_subparsers(dest="token_command", required=True)

    c = tsub.add_parser("create", help="create a token and print its secret (shown only once)")
    c.add_argument("--scope", required=True,
                   help="comma-separated: read, submit, operator (operator implies the others)")
    c.add_argument("--name", required=True, help="who or what the token is for")
    c.add_argument("--tenant", help="the tenant its requests are scheduled and rate-limited "
                   "as ([slo.tenants.NAME] in the config); default: the token's own id")
    c.set_defaults(func=cmd_create)

    ls = tsub.add_parser("list", help="list tokens (never their secrets)")
    ls.add_argument("--json", action="store_true", help="one JSON object per line")
    ls.set_defaults(func=cmd_list)

    r = tsub.add_parser("revoke", help="revoke a token by id; the daemon refuses it at once")
    r.add_argument("id")
    r.set_defaults(func=cmd_revoke)

    for p in (c, ls, r):
        p.add_argument("--data-dir")
        p.add_argument("--db", help="SQLAlchemy URL (default: SQLite file in the data dir)")
        p.add_argument("--config", help="TOML config file")


EXIT_USAGE = 2
EXIT_FAILURE = 1


def _fail(message: str, code: int = EXIT_FAILURE) -> int:
    print(f"agentd: {message}", file=sys.stderr)
    return code


def _with_store(args: argparse.Namespace, work: Callable[[AsyncSession], Awaitable[T]]) -> T:
    from daemon import config as config_mod
    from daemon.core.data_dir import private_dir
    from db.engine import make_engine, make_private, make_sessionmaker, upgrade

    cfg = config_mod.load({"data_dir": args.data_dir, "db": args.db}, config_file=args.config)

    async def run() -> T:
        if not cfg.db:
            private_dir(cfg.data_path)
        make_private(cfg.db_url)  # a first `token create` may create the store
        await upgrade(cfg.db_url)
        engine = make_engine(cfg.db_url)
        try:
            async with make_sessionmaker(engine)() as s, s.begin():
                return await work(s)
        finally:
            await engine.dispose()

    return asyncio.run(run())


def cmd_create(args: argparse.Namespace) -> int:
    from daemon.access import auth
    from daemon.access.names import tenant_problem

    try:
        scopes = auth.parse_scopes(args.scope)
    except ValueError as exc:
        return _fail(str(exc), EXIT_USAGE)
    if not args.name.strip() or len(args.name) > 128:
        return _fail("--name must be 1-128 characters", EXIT_USAGE)
    problem = None if args.tenant is None else tenant_problem(args.tenant)
    if problem is not None:
        return _fail(f"--tenant: {problem}", EXIT_USAGE)

    async def work(s: AsyncSession) -> tuple[str, str]:
        return await auth.issue_token(s, args.name, scopes, args.tenant)

    token_id, secret = _with_store(args, work)
    tenant = args.tenant or token_id
    print(f"created token {token_id} ({args.name}; scopes: {' '.join(sorted(scopes))}; "
          f"tenant: {tenant}); the secret below is shown only once", file=sys.stderr)
    print(secret)
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    from db import tokens

    records = _with_store(args, tokens.list_all)
    rows: list[dict[str, Any]] = [
        {"id": r.id, "name": r.name, "scopes": " ".join(sorted(r.scopes)), "tenant": r.tenant,
         "created_at": r.created_at, "revoked_at": r.revoked_at} for r in records]
    if args.json:
        for row in rows:
            print(json.dumps(row))
        return 0
    print(f"{'ID':<17} {'SCOPES':<22} {'TENANT':<17} {'CREATED':<17} {'STATUS':<25} NAME")
    for row in rows:
        status = "active" if row["revoked_at"] is None else f"revoked {_when(row['revoked_at'])}"
        print(f"{row['id']:<17} {row['scopes']:<22} {row['tenant']:<17} "
              f"{_when(row['created_at']):<17} {status:<25} {row['name']}")
    return 0


def cmd_revoke(args: argparse.Namespace) -> int:
    from db import tokens

    async def work(s: AsyncSession) -> tokens.TokenRecord | None:
        return await tokens.revoke(s, args.id, time.time())

    record = _with_store(args, work)
    if record is None:
        return _fail(f"no token with id '{args.id}' (`agentd token list` shows the ids)")
    print(f"revoked {record.id} ({record.name})")
    return 0


def _when(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(ts))
