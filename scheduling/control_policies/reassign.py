"""Resource reassignment: instances go from agents with little work waiting to agents
with a backlog, within each agent's min/max_instances and an optional total budget.

An agent's expected wait is the work it holds (its calls, queued, waiting or running,
times its mean service time) per instance it has, serving or still starting (capacity
on its way counts, so that one burst does not provision twice). Each step the agent
with the longest wait gets one more instance, if even with it each instance would
hold at least `min_gain_s` of work: a new one while under the budget, else one taken
from the agent that would then wait least, if that agent would still wait
`min_gain_s` less than the receiver (so the next step does not move it back), has
more than its min_instances, and over the last ~30 s left at least `spare` instances'
worth of capacity unused (instances minus their summed utilisation): with one fewer it
still carries what it has been asked to carry. A backlog alone is no reason to give:
when every agent is busy a move only trades one queue for another and loses an
instance's time to the drain and the load. The donor's least-loaded instance holding
no session state is killed: it drains (its queued calls move to its siblings, its
running ones finish) and its resources go to the new one.
"""

from __future__ import annotations

from typing import NamedTuple

from scheduling.control import (
    ControlDecision,
    ControlPolicy,
    ControlView,
    InstanceView,
    kill,
    provision,
)

DEFAULT_SERVICE_S = 1.0  # an agent type nobody has timed yet


class _Agent(NamedTuple):
    name: str
    work_s: float  # its calls times its mean service time
    instances: int  # provisioned: serving or starting

    def wait_s(self, delta: int = 0) -> float:
        n = self.instances + delta
        return self.work_s / n if n > 0 else float("inf")


class ResourceReassignment(ControlPolicy):
    name = "reassign"

    def __init__(self, budget: int | None = None, min_gain_s: float = 5.0,
                 spare: float = 1.0) -> None:
        self.budget = budget
        self.min_gain_s = min_gain_s
        self.spare = spare

    def decide(self, view: ControlView, now: float) -> list[ControlDecision]:
        agents = _agents(view)
        if not agents:
            return []
        hot = max(agents, key=lambda a: a.wait_s())
        if hot.instances >= view.directives(hot.name).max_instances or \
                hot.wait_s(1) < self.min_gain_s:
            return []
        why = f"{hot.wait_s():.1f} s of work per instance"
        if self.budget is None or sum(a.instances for a in agents) < self.budget:
            return [provision(hot.name, reason=why)]
        donor = self._donor(view, agents, hot)
        if donor is None:
            return []
        return [kill(donor, reason=f"reassigned to {hot.name}"), provision(hot.name, reason=why)]

    def _donor(self, view: ControlView, agents: list[_Agent], hot: _Agent) -> str | None:
        # an instance holding a session's state (a pin or a route) is not for taking
        held = set(view.rules.pins.values()) | set(view.rules.routes.values())
        best: tuple[float, str] | None = None
        for a in agents:
            if a is hot or a.instances <= max(1, view.directives(a.name).min_instances):
                continue
            after = a.wait_s(-1)
            if after + self.min_gain_s > hot.wait_s(1) or (best and after >= best[0]):
                continue
            alive = view.instances_of(a.name)
            if len(alive) - sum(i.utilisation for i in alive) < self.spare:
                continue
            free = [i for i in alive if i.instance_id not in held]
            if free:
                best = (after, min(free, key=lambda i: (i.load, i.running)).instance_id)
        return best[1] if best else None


def _agents(view: ControlView) -> list[_Agent]:
    by_type = {t: view.provisioned(t) for t in view.agent_types()}
    by_type = {t: held for t, held in by_type.items() if held}
    timed = {t: s for t, held in by_type.items() if (s := _service_s(held)) is not None}
    fallback = sum(timed.values()) / len(timed) if timed else DEFAULT_SERVICE_S
    return [_Agent(t, sum(i.load for i in held) * timed.get(t, fallback), len(held))
            for t, held in by_type.items()]


def _service_s(instances: list[InstanceView]) -> float | None:
    """Mean service time over the instances that have completed calls."""
    timed = [(i.mean_service_s, i.completed) for i in instances if i.completed]
    if not timed:
        return None
    return sum(s for s, _ in timed) / len(timed)
