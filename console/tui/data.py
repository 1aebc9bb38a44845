"""What the TUI reads from and sends to the daemon, over the public REST API only.

`Poller` gathers one poll's worth of state as a `Snapshot`; the slow parts (tool
disk usage walks the disk, policy events scan the trace) are fetched every few
seconds and carried between polls. Operator actions are `Call` values.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from console.client import AsyncAgentdClient, Call, Json, api, metric_sums

PROGRAM_LIMIT = 500
SESSION_LIMIT = 500
SLOW_EVERY_S = 5.0
ACTIONS = ("pause", "resume", "release", "kill")

Clock = Callable[[], float]


@dataclass(frozen=True)
class Snapshot:
    """One poll of the daemon; `tools` is None until the first slow fetch answered."""

    health: dict[str, Any]
    workers: list[dict[str, Any]]
    programs: list[dict[str, Any]]
    programs_total: int
    taken_at: float
    metrics: dict[str, float] = field(default_factory=dict)
    slo: dict[str, Any] = field(default_factory=dict)  # GET /v1/scheduling
    policies: list[dict[str, Any]] = field(default_factory=list)
    tools: list[dict[str, Any]] | None = None
    policy_events: list[dict[str, Any]] = field(default_factory=list)

    def worker_ids(self) -> list[str]:
        return [str(w["id"]) for w in self.workers]

    def active_policies(self) -> dict[str, str]:
        """'name vN' of the active policy, by layer."""
        return {p["layer"]: f"{p['name']} v{p['active_version']}"
                for p in self.policies if p.get("active")}

    def tools_by_program(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for t in self.tools or []:
            if t.get("program_id") and t.get("tool"):
                names = out.setdefault(str(t["program_id"]), [])
                if t["tool"] not in names:
                    names.append(str(t["tool"]))
        return out


class Poller:
    """Builds snapshots; keeps the slow parts between their fetches."""

    def __init__(self, client: AsyncAgentdClient, clock: Clock,
                 slow_every: float = SLOW_EVERY_S) -> None:
        self.client = client
        self.clock = clock
        self.slow_every = slow_every
        self._slow_at = -math.inf
        self._tools: list[dict[str, Any]] | None = None
        self._policy_events: list[dict[str, Any]] = []

    def force_slow(self) -> None:
        """Fetch the slow parts on the next poll (after an action changed them)."""
        self._slow_at = -math.inf

    async def snapshot(self) -> Snapshot:
        c = self.client
        health = await c.call(api.healthz())
        workers = (await c.call(api.workers()))["data"]
        programs = await c.call(api.programs(limit=PROGRAM_LIMIT))
        text = await c.call(api.metrics())
        policies = (await c.call(api.policies()))["data"]
        slo = await c.call(api.scheduling())
        now = self.clock()
        if now - self._slow_at >= self.slow_every:
            await self._fetch_slow(policies)
            self._slow_at = now
        return Snapshot(health, workers, programs["data"], int(programs["total"]), now,
                        metric_sums(text), slo, policies, self._tools, self._policy_events)

    async def _fetch_slow(self, policies: list[dict[str, Any]]) -> None:
        self._tools = (await self.client.call(api.tools()))["data"]
        events: list[dict[str, Any]] = []
        # A rollback is recorded under the policy it restored, which is the active one now.
        for p in policies:
            if p.get("active"):
                events += (await self.client.call(api.policy(p["name"]))).get("events", [])
        self._policy_events = events


async def fetch_trace(client: AsyncAgentdClient, session_id: str,
                      after: int = 0) -> list[Json]:
    """The session's trace events with ids above `after`, following the `next_after` pages."""
    events: list[Json] = []
    while True:
        answer = await client.call(api.trace(session_id, after, 5000))
        events.extend(answer["data"])
        if answer.get("next_after") is None:
            return events
        after = int(answer["next_after"])


async def fetch_sessions(client: AsyncAgentdClient) -> tuple[list[Json], int]:
    answer = await client.call(api.sessions(limit=SESSION_LIMIT))
    return answer["data"], int(answer["total"])


def program_action(action: str, program_id: str) -> Call:
    """POST /v1/programs/{id}/pause|resume|release|kill."""
    if action not in ACTIONS:
        raise ValueError(f"unknown program action {action!r}")
    return api.program_action(action, program_id)


def migrate_session(session_id: str, worker_id: str, now: bool = False) -> Call:
    return api.migrate("session", session_id, worker_id, now)
