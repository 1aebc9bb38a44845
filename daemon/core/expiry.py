"""Programs that end when idle: `program_idle_timeout_s` (the clock: scheduling/kv/idle.py).

A program that has had no request for its timeout (the config's `program_idle_timeout_s`,
a tenant's `[slo.tenants.NAME] program_idle_timeout_s`, or `lineage_idle_s` for the
programs lineage inference holds, daemon/core/lineage.py) is ended as a release would end
it: STOPPED, which reclaims its tools (daemon/toolsvc: the core's `on_program_end`), with
the trace event `program.expired` (idle seconds, timeout, the setting that gave it) and
the reason "idle for N s (...)". Never while a request of it is queued or running, nor
while a tool agentd runs for it is executing, nor while a live workflow run owns it (its
run ends it, `keep`).

Signs of life: a request queued (`on_program_waiting`) or ended (`on_request_end`); a
tool call's end is read from the KV layer's tool clock when a program comes due. The
core's health loop calls `tick()`; `clock` is injectable so a test drives it without
sleeping. Programs still live in the store after a restart (not in memory) are tracked
from their last status change (`load_stored`) and loaded when they come due.

An operator (or a tenant, for its own programs) ends every program quiet for at least
N seconds at once with `release_idle` (POST /v1/programs/release-idle).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from sqlalchemy import select

from daemon.state import ProgramState, ProgramStatus, RequestState
from db import models
from scheduling.kv.idle import TIMEOUT_KEY, IdleClock, Quiet, tenant_timeouts

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import async_sessionmaker

    from daemon.config import Config
    from daemon.kv.loop import KvControl
    from daemon.slo.stack import SloControl
    from daemon.workers.protocol import Finish
    from db.writer import BatchWriter

log = logging.getLogger("agentd.expiry")

DEFAULT_TENANT = "default"  # daemon/access/names.py's, for a program nobody set one for
_ENDED = (ProgramStatus.STOPPED, ProgramStatus.FAILED)
_LIVE = [s.value for s in ProgramStatus if s not in _ENDED]


class Core(Protocol):
    """What of the core (daemon/core/core.py) the expiry uses."""

    config: Config
    programs: dict[str, ProgramState]
    writer: BatchWriter
    sessions: async_sessionmaker[Any]
    kv: KvControl
    slo: SloControl
    on_program_waiting: list[Callable[[ProgramState], None]]
    on_request_end: list[Callable[[RequestState, Finish | None], None]]
    on_program_end: list[Callable[[ProgramState], None]]

    def set_program_status(self, program: ProgramState, status: ProgramStatus,
                           reason: str) -> None: ...

    async def load_program(self, program_id: str) -> ProgramState | None: ...


class ProgramExpiry:
    """Tracks each live program's quiet time and ends the idle ones (module docstring)."""

    def __init__(self, core: Core, clock: Callable[[], float] = time.time) -> None:
        self._core = core
        self.clock = clock
        self.default_s = core.config.program_idle_timeout_s
        self.tenant_s = tenant_timeouts(core.config.slo.get("tenants", {}))
        self.idle = IdleClock()
        self._limits: dict[str, tuple[float, str]] = {}  # per program (lineage's)
        # Owners that end their programs themselves (a live workflow run): kept.
        self.keep: list[Callable[[str], bool]] = []
        self._tasks: set[asyncio.Task[None]] = set()
        core.on_program_waiting.append(self.lived)
        core.on_request_end.append(self._request_ended)
        core.on_program_end.append(self._ended)

    # --- signs of life ------------------------------------------------------------------

    def lived(self, program: ProgramState, at: float | None = None) -> None:
        """The program showed life (now, or at `at`): its quiet time starts again."""
        if program.status in _ENDED:
            return
        tenant = self._core.slo.tagging.tenants.get(program.id, DEFAULT_TENANT)
        timeout, setting = self.timeout_of(program.id, tenant)
        self.idle.touch(Quiet(program.id, tenant, self.clock() if at is None else at,
                              timeout, setting))

    def limit(self, program: ProgramState, timeout_s: float, setting: str) -> None:
        """This program's own timeout instead of its tenant's (lineage: `lineage_idle_s`)."""
        self._limits[program.id] = (timeout_s, setting)
        quiet = self.idle.get(program.id)
        self.lived(program, None if quiet is None else quiet.since)

    def timeout_of(self, program_id: str, tenant: str) -> tuple[float, str]:
        """(timeout in seconds, the config key that sets it); 0: never expires."""
        if program_id in self._limits:
            return self._limits[program_id]
        if tenant in self.tenant_s:
            return self.tenant_s[tenant], f"slo.tenants.{tenant}.{TIMEOUT_KEY}"
        return self.default_s, TIMEOUT_KEY

    def _request_ended(self, req: RequestState, _finish: Finish | None) -> None:
        program = self._core.programs.get(req.program_id)
        if program is not None:
            self.lived(program)

    def _ended(self, program: ProgramState) -> None:
        self.idle.forget(program.id)
        self._limits.pop(program.id, None)

    # --- the check ----------------------------------------------------------------------

    def tick(self) -> None:
        """End the programs whose quiet time reached their timeout (the health loop)."""
        now = self.clock()
        for quiet in self.idle.due(now):
            try:
                self._check(quiet, now)
            except Exception:  # one program's end must not stop the health loop
                log.exception("ending idle program %s failed", quiet.program_id)

    def _check(self, quiet: Quiet, now: float) -> None:
        since = self._quiet_since(quiet, now)
        if since is None:
            return
        if since + quiet.timeout_s > now:
            self.idle.touch(dataclasses.replace(quiet, since=since))
            return
        reason = f"idle for {now - since:.0f} s ({quiet.setting} = {quiet.timeout_s:g})"
        self._end(quiet, now, reason, by=None)

    def _quiet_since(self, quiet: Quiet, now: float) -> float | None:
        """When the program last showed life, or None while it is busy (then it is touched
        at `now`) or ended. A program not in memory (from the store) is as tracked."""
        pid = quiet.program_id
        program = self._core.programs.get(pid)
        if program is not None and program.status in _ENDED:
            return None
        busy = any(keep(pid) for keep in self.keep)
        clock = self._core.kv.tools.get(pid)
        if program is not None:
            busy = busy or program.active_request is not None
        if busy or (clock is not None and clock.running):
            self.idle.touch(dataclasses.replace(quiet, since=now))
            return None
        ended_at = clock.ended_at if clock is not None else None
        return max(quiet.since, ended_at or quiet.since)

    def _end(self, quiet: Quiet, now: float, reason: str, by: str | None) -> None:
        program = self._core.programs.get(quiet.program_id)
        if program is None:
            task = asyncio.get_running_loop().create_task(self._end_stored(quiet, now, reason, by))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            return
        self._stop(program, quiet, now, reason, by)

    async def _end_stored(self, quiet: Quiet, now: float, reason: str, by: str | None) -> None:
        core = self._core
        loaded = await core.load_program(quiet.program_id)
        program = core.programs.get(quiet.program_id)  # loaded meanwhile by a request?
        if program is None and loaded is not None and loaded.status not in _ENDED:
            core.programs[loaded.id] = program = loaded
        if program is not None and program.active_request is None:
            self._stop(program, quiet, now, reason, by)
        elif program is not None:
            self.lived(program)

    def _stop(self, program: ProgramState, quiet: Quiet, now: float, reason: str,
              by: str | None) -> None:
        self.idle.forget(program.id)
        if program.status in _ENDED:
            return
        self._core.writer.trace(
            "program.expired", session_id=program.session_id, program_id=program.id,
            idle_s=round(quiet.idle_s(now), 3), timeout_s=quiet.timeout_s,
            setting=quiet.setting, tenant=quiet.tenant, by=by)
        log.info("program %s ended: %s", program.id, reason)
        self._core.set_program_status(program, ProgramStatus.STOPPED, reason)

    # --- bulk release and restarts ----------------------------------------------------

    async def release_idle(self, at_least_s: float, tenant: str | None, by: str,
                           dry_run: bool = False) -> list[Quiet]:
        """End every program (of `tenant`, if given) quiet for at least `at_least_s`;
        the ones ended (or that would be, with `dry_run`), longest quiet first."""
        now = self.clock()
        chosen = []
        for quiet in self.idle.quiet_for(now, at_least_s, tenant):
            since = self._quiet_since(quiet, now)
            if since is not None and now - since >= at_least_s:
                chosen.append(dataclasses.replace(quiet, since=since))
        if not dry_run:
            for quiet in chosen:
                self._end(quiet, now, f"idle for {quiet.idle_s(now):.0f} s "
                          f"(released as idle by {by})", by)
            await self.settled()
            await self._core.writer.flush()
        return chosen

    async def settled(self) -> None:
        """Wait for the ends of programs that had to be loaded from the store first."""
        await asyncio.gather(*list(self._tasks))

    async def load_stored(self) -> None:
        """Track the programs the store holds as live that are not in memory (left by the
        previous daemon run), from their last status change."""
        query = (select(models.Program.id, models.Program.status_since, models.Session.tenant)
                 .join(models.Session, models.Session.id == models.Program.session_id)
                 .where(models.Program.status.in_(_LIVE))
                 .order_by(models.Program.status_since))
        async with self._core.sessions() as s:
            rows = (await s.execute(query)).all()
        for pid, since, tenant in rows:
            if pid not in self._core.programs and pid not in self.idle:
                timeout, setting = self.timeout_of(pid, tenant)
                self.idle.touch(Quiet(pid, tenant, since, timeout, setting))
