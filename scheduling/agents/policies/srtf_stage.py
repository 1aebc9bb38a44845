"""Shortest remaining time first, by stage (NALAR §6.2): a session whose calls are deeper
in its graph has less work left, so its calls go first."""

from __future__ import annotations

from scheduling.agents.policy import ControlDecision, ControlPolicy, ControlView, set_priority


class SrtfByStage(ControlPolicy):
    name = "srtf-stage"

    def decide(self, view: ControlView, now: float) -> list[ControlDecision]:
        installed = view.rules.priorities
        return [set_priority(s.session_id, float(s.deepest_stage), reason="srtf: deepest stage")
                for s in view.sessions.values()
                if installed.get(s.session_id, 0.0) != s.deepest_stage]
