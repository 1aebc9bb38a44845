"""Longest processing time first for retries (NALAR §6.2): a session re-entering the graph
after a failed attempt holds up the makespan, so its calls go first."""

from __future__ import annotations

from scheduling.agents.policy import ControlDecision, ControlPolicy, ControlView, set_priority


class LptRetries(ControlPolicy):
    name = "lpt-retries"

    def decide(self, view: ControlView, now: float) -> list[ControlDecision]:
        installed = view.rules.priorities
        return [set_priority(s.session_id, float(s.max_attempt), reason="lpt: retried first")
                for s in view.sessions.values()
                if installed.get(s.session_id, 0.0) != s.max_attempt]
