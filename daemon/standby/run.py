"""How `agentd start` holds the store's lease around serving (db/lease.py).

On PostgreSQL every daemon takes the lease before it touches the store. An active one
(no --standby) that finds it held exits with one line naming the holder. A standby
answers 503 on its port (daemon/standby/answer.py) until the lease is its own, then stops
that answer, fences the old holder's connections off, binds the same port and starts as
any daemon does: migrations, crash recovery of the durable state, workers, API.

A daemon that loses its lease (its lease connection fails: the database restarted, the
network between them cut) exits at once with EXIT_LEASE_LOST, without another write: a
standby may own the store already. Its supervisor (systemd's Restart=) starts it again,
as a standby of the new holder or as the active daemon if none took over.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import Callable
from typing import Any

import uvicorn
from sqlalchemy.engine import make_url

from daemon.config import Config
from daemon.standby.answer import standby_app
from db.lease import StoreLease, supports_lease, this_instance

log = logging.getLogger("agentd.standby")

EXIT_LEASE_LOST = 3
RETRY_WAIT_S = 1.0  # a standby whose lease connection failed tries again after this

ServerConfig = Callable[[Any], uvicorn.Config]
Listen = Callable[[], socket.socket]


class StartRefused(Exception):
    """The lease is another daemon's and this one is not a standby, or the store cannot
    be reached to take it: one line for the CLI."""


def _lost(reason: str) -> None:
    log.critical("agentd lost the store lease (%s): exiting now, without another write; "
                 "a standby may own the store", reason)
    os._exit(EXIT_LEASE_LOST)  # no cleanup: it would write to a store that is not ours


async def serve(cfg: Config, standby: bool, sock: socket.socket, listen: Listen,
                app: Callable[[], Any], server_config: ServerConfig) -> bool:
    """Serve `app` on `sock` holding the store's lease (PostgreSQL) or as is (SQLite);
    True once the server started (False: it never did), as uvicorn's `started`."""
    lease: StoreLease | None = None
    if supports_lease(cfg.db_url):
        lease = StoreLease(cfg.db_url, this_instance(), on_lost=_lost)
        try:
            free = await lease.try_acquire()
        except Exception as exc:
            where = make_url(cfg.db_url).render_as_string(hide_password=True)
            reason = f"{type(exc).__name__}: {exc}".splitlines()[0]
            raise StartRefused(f"cannot reach the store at {where}: {reason}") from exc
        if not free:
            if not standby:
                holder = await lease.holder()
                raise StartRefused(f"another agentd holds this database's lease ({holder}); "
                                "start this one with --standby to take over when it stops")
            if not await _stand_by(lease, sock, server_config):
                return True  # stopped while standing by: a clean stop
            sock = listen()  # the standby's answer closed its socket
        elif standby:
            log.info("no daemon holds the store's lease: this standby serves at once")
        fenced = await lease.fence()
        if fenced:
            log.warning("took the store's lease over: ended %d connection(s) of the old "
                        "holder", fenced)
        lease.start_watch()
    server = uvicorn.Server(server_config(app()))
    try:
        await server.serve(sockets=[sock])
    finally:
        if lease is not None:
            await lease.close()
    return server.started


async def _stand_by(lease: StoreLease, sock: socket.socket,
                    server_config: ServerConfig) -> bool:
    """Answer 503 on `sock` until the lease is ours (True), or a signal stops us (False)."""
    answer = uvicorn.Server(server_config(standby_app()))
    answering = asyncio.create_task(answer.serve(sockets=[sock]))
    waiting = asyncio.create_task(_wait_for_lease(lease))
    log.info("agentd standing by: the store's lease is another daemon's")
    done, _ = await asyncio.wait({answering, waiting}, return_when=asyncio.FIRST_COMPLETED)
    if waiting not in done:  # SIGTERM/SIGINT while standing by
        waiting.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await waiting
        await lease.close()
        return False
    answer.should_exit = True
    await answering
    log.info("agentd took the store's lease: starting as the active daemon")
    return True


async def _wait_for_lease(lease: StoreLease) -> None:
    while True:
        try:
            await lease.wait_acquire()
            return
        except Exception as exc:  # the database restarted, say: wait again
            log.warning("standby's lease connection failed (%s); waiting again",
                        f"{type(exc).__name__}: {exc}".splitlines()[0])
            await lease.close()
            await asyncio.sleep(RETRY_WAIT_S)
