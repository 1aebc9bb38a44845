"""Head-of-line migration: a call waiting behind a busy instance moves to an idle one
of the same agent (NALAR Fig. 6, for every session rather than one).

Per idle instance (nothing queued, a slot free; those with no call waiting for a
dependency first), at most one call per step, from the instance whose queue has waited
longest: its highest-priority queued call, and of those the one furthest back (it
would wait longest, and it is the least likely to have started by the time the
decision lands: views are a moment old). A session with an installed route (state kept
on its instance) moves whole, state and all. An instance whose calls all wait for
dependencies is idle too: an agent whose every call fans out first (an analyst
waiting on its sub-agents) would otherwise never have anywhere to move to.
"""

from __future__ import annotations

from scheduling.control import (
    ControlDecision,
    ControlPolicy,
    ControlView,
    FutureStatus,
    FutureView,
    InstanceView,
    migrate,
)


def _blocked(view: ControlView, agent: str, now: float) -> list[InstanceView]:
    busy = [i for i in view.instances_of(agent) if i.queued and i.running >= i.slots]
    return sorted(busy, key=lambda i: now if i.oldest_queued_at is None else i.oldest_queued_at)


class HeadOfLineMigration(ControlPolicy):
    name = "hol-migration"

    def decide(self, view: ControlView, now: float) -> list[ControlDecision]:
        out: list[ControlDecision] = []
        for agent in view.agent_types():
            if view.directives(agent).stateful:
                continue
            idle = sorted((i for i in view.instances_of(agent) if i.idle),
                          key=lambda i: i.waiting)
            for dst, src in zip(idle, _blocked(view, agent, now), strict=False):
                f = self._head(view, src.instance_id, agent)
                whole = (f.session_id, agent) in view.rules.routes
                out.append(migrate(f.session_id, src.instance_id, dst.instance_id,
                                   None if whole else f.future_id,
                                   reason=f"head-of-line: {dst.instance_id} is idle"))
        return out

    def _head(self, view: ControlView, instance_id: str, agent: str) -> FutureView:
        queued = [f for f in view.futures_at(instance_id) if f.status is FutureStatus.QUEUED]
        return max(queued, key=lambda f: (view.priority(f.session_id, agent), f.seq))
