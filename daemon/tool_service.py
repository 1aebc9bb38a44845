"""Tool environments owned by programs, wired into the daemon.

Programs acquire environments on first use or declare them up front (then they
are prepared while the program still waits in the global queue). When a program
ends, everything it holds is removed. At start, and every sweep interval, the
daemon reclaims resources labelled with its id whose program is not live.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from pathlib import Path
from typing import Any

from daemon.config import Config
from daemon.core import Core
from daemon.state import ProgramState
from tools import DockerBackend, ProcessBackend, ToolManager, ToolSpec, parse_spec

log = logging.getLogger("agentd.tools")

SWEEP_INTERVAL_S = 60.0
_LIVE = {"QUEUED", "REASONING", "ACTING", "PAUSED"}


def daemon_id(data_dir: Path) -> str:
    """A stable id for this daemon's data dir: its labels survive restarts."""
    path = data_dir / "daemon_id"
    if not path.exists():
        path.write_text(f"agentd-{uuid.uuid4().hex[:12]}\n")
    return path.read_text().strip()


def catalog(cfg: Config) -> dict[str, ToolSpec]:
    """The configured tools; `config.validate` already refused any that do not parse."""
    return {name: parse_spec({"name": name, **raw}, trusted=True)
            for name, raw in cfg.tools.items()}


class ToolService:
    def __init__(self, core: Core, cfg: Config) -> None:
        self.core = core
        self.manager = ToolManager(
            daemon_id(cfg.data_path),
            {"docker": DockerBackend(), "process": ProcessBackend(cfg.data_path / "tools")},
            catalog=catalog(cfg),
            on_event=self._on_event,
        )
        self._tasks: set[asyncio.Task[Any]] = set()
        core.on_program_end.append(self._program_ended)
        core.on_program_waiting.append(self._prepare_declared)
        self.declared: dict[str, list[str]] = {}

    async def start(self) -> None:
        reclaimed = await self.manager.reconcile(self.live_programs)
        if reclaimed:
            log.info("reclaimed %d tool resources of ended programs", len(reclaimed))
        self._spawn(self._sweep_loop())

    async def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.manager.close()

    def declare(self, program: ProgramState, tools: list[str]) -> None:
        """Tools the program will use: prepared while it waits for admission."""
        for tool in tools:
            self.manager.spec_for(tool)  # unknown tools fail here, before anything starts
        known = self.declared.setdefault(program.id, [])
        known += [t for t in tools if t not in known]

    def _prepare_declared(self, program: ProgramState) -> None:
        for tool in self.declared.get(program.id, []):
            self.manager.prepare(program.id, self.manager.spec_for(tool))

    def _program_ended(self, program: ProgramState) -> None:
        self.declared.pop(program.id, None)
        # Most programs never touch a tool; asking every backend about them would cost a
        # Docker round trip per request. Leftovers of earlier runs go in the sweep.
        if self.manager.holds(program.id):
            self._spawn(self.manager.release_program(program.id))

    async def live_programs(self) -> set[str]:
        await self.core.writer.flush()
        live = await self.core.live_program_ids()
        return live | {p.id for p in self.core.programs.values() if p.status.value in _LIVE}

    async def _sweep_loop(self) -> None:
        while True:
            await asyncio.sleep(SWEEP_INTERVAL_S)
            await self.manager.reconcile(self.live_programs)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _on_event(self, event: dict[str, Any]) -> None:
        fields = {k: v for k, v in event.items() if k not in ("kind", "at")}
        pid = fields.pop("program_id", None)
        program = self.core.programs.get(pid) if pid else None
        self.core.writer.trace(
            event["kind"], program_id=pid,
            session_id=program.session_id if program else None, **fields,
        )
