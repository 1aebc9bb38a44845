"""Load-balanced routing: weight each instance by the calls per second it completes, so
that placement (least load per unit of weight) sends less to slow instances."""

from __future__ import annotations

from scheduling.control import ControlDecision, ControlPolicy, ControlView, InstanceView, route

MIN_SERVICE_S = 1e-3


def _weights(instances: list[InstanceView]) -> tuple[float, ...]:
    rates = [1.0 / max(i.mean_service_s, MIN_SERVICE_S) if i.completed else 0.0
             for i in instances]
    known = [r for r in rates if r > 0]
    if not known:
        return (1.0,) * len(instances)
    fallback = sum(known) / len(known)  # an instance with no history counts as average
    top = max(known)
    return tuple(round((r or fallback) / top, 1) or 0.1 for r in rates)


class LoadBalanced(ControlPolicy):
    name = "load-balanced"

    def decide(self, view: ControlView, now: float) -> list[ControlDecision]:
        out: list[ControlDecision] = []
        for agent in view.agent_types():
            alive = view.instances_of(agent)
            if len(alive) < 2:
                continue
            ids = tuple(i.instance_id for i in alive)
            weights = _weights(alive)
            if view.rules.weights.get(agent) != (ids, weights):
                out.append(route(agent, ids, weights=weights, reason="weights by throughput"))
        return out
