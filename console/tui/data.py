"""What the TUI reads from and sends to the daemon, over the public REST API only.

`fetch_snapshot` gathers one poll's worth of state; the operator actions are
`Call` values built here (the shared client has no builders for them yet).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from console.client import AsyncAgentdClient, Call, Json, api

PROGRAM_LIMIT = 500
ACTIONS = ("pause", "resume", "release", "kill")


@dataclass(frozen=True)
class Snapshot:
    """One poll of the daemon: health, workers and the newest programs."""

    health: dict[str, Any]
    workers: list[dict[str, Any]]
    programs: list[dict[str, Any]]
    programs_total: int
    taken_at: float = field(default_factory=time.time)

    def worker_ids(self) -> list[str]:
        return [str(w["id"]) for w in self.workers]


async def fetch_snapshot(client: AsyncAgentdClient) -> Snapshot:
    health = await client.call(api.healthz())
    workers = (await client.call(api.workers()))["data"]
    programs = await client.call(api.programs(limit=PROGRAM_LIMIT))
    return Snapshot(health, workers, programs["data"], int(programs["total"]))


async def fetch_trace(client: AsyncAgentdClient, session_id: str) -> list[Json]:
    """Every trace event of the session, following the `next_after` pages."""
    events: list[Json] = []
    after = 0
    while True:
        answer = await client.call(api.trace(session_id, after, 5000))
        events.extend(answer["data"])
        if answer.get("next_after") is None:
            return events
        after = int(answer["next_after"])


def program_action(action: str, program_id: str) -> Call:
    """POST /v1/programs/{id}/pause|resume|release|kill."""
    if action not in ACTIONS:
        raise ValueError(f"unknown program action {action!r}")
    return api.program_action(action, program_id)


def migrate_session(session_id: str, worker_id: str, now: bool = False) -> Call:
    return api.migrate("session", session_id, worker_id, now)
