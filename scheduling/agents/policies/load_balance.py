"""Load-balanced routing: weight each instance by the work it holds, so that a new call
goes where it is expected to start soonest.

Placement sends a call to the instance with the least (load + 1) / weight (calls
held, control_rules.py). The weight here is (load + 1) * s / (work + s), s the type's
mean service time (estimates.py), so at the step that ratio is the instance's
expected wait plus the call itself, in calls of s: a call running far past the mean
counts for more than one just started. Each call placed after the step adds the
average size of what the instance holds, about one s, to its ratio: calls spread as
they arrive, and no instance takes a step's worth of new sessions at once (as it did
when weights came from each instance's own mean service time: one that had just run
short calls weighed ten times the others, and sticky sessions stayed where it piled
them).

The work also counts the instance's recent utilisation as that fraction of one call:
sessions keep their state where they ran and come back to it, so an instance that has
been busy expects more than it holds now. Placement takes the first of equal ratios,
so instances are listed least utilised first: ties would otherwise always go to the
first instance, and sticky sessions would gather on it.
"""

from __future__ import annotations

from scheduling.agents.policies.estimates import backlog_s, mean_service
from scheduling.agents.policy import (
    ControlDecision,
    ControlPolicy,
    ControlView,
    InstanceView,
    route,
)


def _weights(view: ControlView, instances: list[InstanceView],
             now: float) -> tuple[float, ...]:
    s = mean_service(instances)
    raw = [(i.load + 1) * s / (backlog_s(view, i, s, now) + (i.utilisation + 1) * s)
           for i in instances]
    top = max(raw)
    # two decimals: weights that barely moved are not worth a new rule and its trace
    return tuple(round(w / top, 2) or 0.01 for w in raw)


class LoadBalanced(ControlPolicy):
    name = "load-balanced"

    def decide(self, view: ControlView, now: float) -> list[ControlDecision]:
        out: list[ControlDecision] = []
        for agent in view.agent_types():
            alive = sorted(view.instances_of(agent), key=lambda i: i.utilisation)
            if len(alive) < 2:
                continue
            ids = tuple(i.instance_id for i in alive)
            weights = _weights(view, alive, now)
            if view.rules.weights.get(agent) != (ids, weights):
                out.append(route(agent, ids, weights=weights, reason="weights by backlog"))
        return out
