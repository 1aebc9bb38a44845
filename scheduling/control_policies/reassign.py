"""Resource reassignment: instances go from agents with little work to agents with a
backlog, within each agent's min/max_instances and an optional total budget.

An agent is hot when it holds more than `hot_load` calls per instance it has (serving
or still starting: capacity on its way counts, so one burst does not provision twice).
It can spare an instance when nothing of it is queued, it has more than min_instances,
and over the last ~30 s it left at least `spare` instances' worth of capacity unused
(instances minus their summed utilisation): an agent idle for a moment, or one whose
new instance has no history yet, keeps it. Each step provisions one instance for the
hottest agent, killing an idle instance of the agent with the most to spare first when
the budget is used up.
"""

from __future__ import annotations

from scheduling.control import ControlDecision, ControlPolicy, ControlView, kill, provision


class ResourceReassignment(ControlPolicy):
    name = "reassign"

    def __init__(self, hot_load: float = 2.0, budget: int | None = None,
                 spare: float = 1.5) -> None:
        self.hot_load = hot_load
        self.budget = budget
        self.spare = spare

    def decide(self, view: ControlView, now: float) -> list[ControlDecision]:
        per: dict[str, float] = {}
        for agent in view.agent_types():
            held = view.provisioned(agent)
            if held:
                per[agent] = sum(i.load for i in held) / len(held)
        hot = [a for a in sorted(per, key=per.__getitem__, reverse=True)
               if per[a] > self.hot_load
               and len(view.provisioned(a)) < view.directives(a).max_instances]
        if not hot:
            return []
        total = sum(len(view.provisioned(a)) for a in per)
        if self.budget is None or total < self.budget:
            return [provision(hot[0], reason=f"backlog {per[hot[0]]:.1f} per instance")]
        victim = self._idle_spare(view, exclude=hot[0])
        if victim is None:
            return []
        return [kill(victim, reason=f"idle; reassigned to {hot[0]}"),
                provision(hot[0], reason=f"backlog {per[hot[0]]:.1f} per instance")]

    def _idle_spare(self, view: ControlView, exclude: str) -> str | None:
        spare: list[tuple[float, str]] = []
        pinned = set(view.rules.pins.values())
        for agent in view.agent_types():
            alive = view.instances_of(agent)
            if agent == exclude or len(alive) <= max(1, view.directives(agent).min_instances):
                continue
            unused = len(alive) - sum(i.utilisation for i in alive)
            if any(i.queued for i in alive) or unused < self.spare:
                continue
            idle = [i.instance_id for i in alive if i.load == 0 and i.instance_id not in pinned]
            if idle:
                spare.append((-unused, idle[-1]))
        return min(spare)[1] if spare else None
