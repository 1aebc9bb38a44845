"""The agent instances a session's calls can move to, offered by the migrate modal.

A workflow run places its agent calls on agent instances (NALAR); the daemon lists a
live run's instances and calls (GET /v1/runs/{id}/control) and takes an operator's
Migrate decision for it (POST /v1/runs/{id}/control/decisions): the session's calls of
one agent type that have not started, and its state there, move from the instance that
holds them to another live instance of that type. The daemon validates the decision
(it refuses stateful agent types, for one) and traces it; the moved calls then show in
the session's trace as `future.migrated`.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from console.client import AsyncAgentdClient, Call, ClientError, Json, api

RUN_ENDED = ("finished", "failed", "cancelled")
MOVABLE = ("waiting", "queued")  # a call's statuses before it starts on its instance


@dataclass(frozen=True)
class InstanceMove:
    """Move the session's waiting calls of `agent_type` from `source` to `destination`;
    `source` None when none of them waits on an instance of that type now."""

    run_id: str
    session_id: str
    agent_type: str
    source: str | None
    destination: str
    waiting: int = 0
    load: int = 0

    @property
    def possible(self) -> bool:
        return self.source is not None

    def label(self) -> str:
        where = (f"from {self.source} ({self.waiting} waiting)" if self.source
                 else "nothing of this session waits")
        return f"{self.destination}  {self.agent_type} instance  load {self.load}  {where}"

    def describe(self) -> str:
        return (f"move session {self.session_id}'s {self.agent_type} calls "
                f"{self.source} → {self.destination} (run {self.run_id})")

    def call(self) -> Call:
        decision = {"kind": "Migrate", "session_id": self.session_id, "source": self.source,
                    "destination": self.destination, "reason": "operator (agentctl tui)"}
        return api.run_decisions(self.run_id, [decision])


def instance_moves(run_id: str, session_id: str, control: dict[str, Any]) -> list[InstanceMove]:
    """Every live instance a move could target, from one run's control view."""
    calls = [f for f in control.get("futures") or [] if f.get("session_id") == session_id]
    routes = {(r[0], r[1]): r[2] for r in control.get("routes") or [] if len(r) == 3}
    out = []
    for inst in control.get("instances") or []:
        if inst.get("state") != "active":
            continue
        kind = str(inst["agent_type"])
        waiting = Counter(str(f["executor"]) for f in calls if f.get("agent_type") == kind
                          and f.get("status") in MOVABLE and f.get("executor"))
        # a route holds the session's state: that is what a move must start from
        source = routes.get((session_id, kind)) or (
            waiting.most_common(1)[0][0] if waiting else None)
        if inst["instance_id"] == source:
            continue
        load = int(inst.get("queued", 0)) + int(inst.get("waiting", 0)) \
            + int(inst.get("running", 0))
        out.append(InstanceMove(run_id, session_id, kind, source, str(inst["instance_id"]),
                                waiting.get(source or "", 0), load))
    return out


async def fetch_instance_moves(client: AsyncAgentdClient, session_id: str) -> list[InstanceMove]:
    """The moves of every live run in the session; none when the daemon runs no workflows."""
    try:
        runs = (await client.call(api.runs()))["data"]
    except ClientError as exc:
        if exc.status == 503:  # this daemon has no workflow runtime
            return []
        raise
    moves: list[InstanceMove] = []
    for run in runs:
        if run.get("session_id") != session_id or run.get("status") in RUN_ENDED:
            continue
        control = await client.call(api.run_control(str(run["id"])))
        if control.get("reported"):
            moves += instance_moves(str(run["id"]), session_id, control)
    return moves


def decision_outcome(answer: Json) -> str:
    """The daemon's verdict on the one decision sent; a refusal is an error to show."""
    [result] = answer["results"]
    if not result.get("ok"):
        raise ClientError(f"refused: {result.get('reason')}")
    return "accepted; the moved calls appear in the trace as they move"
