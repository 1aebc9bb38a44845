"""Operator actions on programs: migrate, pause, resume, kill.

Each action changes the live state through the KV controller or the core and
leaves a trace event naming who did it.
"""

from __future__ import annotations

from typing import Any

from daemon.core.core import Core
from daemon.errors import CoreError
from daemon.state import ProgramState, ProgramStatus
from scheduling.kv import MarkPauseAfterRequest, Pause

_ENDED = (ProgramStatus.STOPPED, ProgramStatus.FAILED)


async def live_program(core: Core, program_id: str) -> ProgramState:
    program = core.programs.get(program_id) or await core.load_program(program_id)
    if program is None:
        raise CoreError(f"unknown program '{program_id}'", status=404, code="not_found")
    if program.status in _ENDED:
        raise CoreError(f"program '{program_id}' has ended ({program.status})", status=409,
                        code="program_ended")
    return program


def _check_worker(core: Core, worker_id: str) -> None:
    worker = core.workers.get(worker_id)
    if worker is None:
        raise CoreError(f"unknown worker '{worker_id}'", status=404, code="not_found")
    if not worker.healthy:
        raise CoreError(f"worker '{worker_id}' is {worker.status}", status=409,
                        code="worker_unavailable")


async def migrate(core: Core, program_ids: list[str], worker_id: str, now: bool,
                  by: str) -> list[dict[str, Any]]:
    _check_worker(core, worker_id)
    programs = [await live_program(core, pid) for pid in program_ids]
    moved = []
    for program in programs:
        source = program.worker_id
        plan = core.kv.migrate(program, worker_id, now, by)
        moved.append({"program_id": program.id, "from": source, "to": worker_id,
                      "recompute_tokens": plan.recompute_tokens,
                      "deferred": program.pause_marked})
    await core.writer.flush()
    return moved


async def pause(core: Core, program_id: str, by: str) -> ProgramState:
    program = await live_program(core, program_id)
    program.held = True
    if program.status == ProgramStatus.REASONING:
        core.kv.apply([MarkPauseAfterRequest(program.id, f"paused by {by}")])
    elif program.status == ProgramStatus.ACTING and program.worker_id is not None:
        core.kv.apply([Pause(program.id, program.worker_id, f"paused by {by}")])
    else:
        core.set_program_status(program, ProgramStatus.PAUSED, f"paused by {by}")
    await core.writer.flush()
    return program


async def resume(core: Core, program_id: str, by: str) -> ProgramState:
    program = await live_program(core, program_id)
    if not program.held:
        raise CoreError(f"program '{program_id}' is not paused by an operator", status=409,
                        code="not_paused")
    program.held = False
    core.writer.trace("program.resumed", session_id=program.session_id,
                      program_id=program.id, by=by)
    core.kv.tick()
    core.pump()
    await core.writer.flush()
    return program


async def kill(core: Core, program_id: str, by: str) -> ProgramState:
    program = await live_program(core, program_id)
    if program.active_request is not None:
        await core.abort(program.active_request, reason=f"killed by {by}")
    core.set_program_status(program, ProgramStatus.FAILED, f"killed by {by}")
    await core.writer.flush()
    return program
