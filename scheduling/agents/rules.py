"""The installed rules: what the global controller wrote and local controllers read.

NALAR keeps these in a node store between the two levels; here it is one `RuleTable`
per host, read on every future (`priority` is two dict lookups) and written only when a
decision is installed.
"""

from __future__ import annotations

from collections.abc import Callable

from scheduling.agents.policy import Route, Rules, SetPriority, WeightedRoute


class RuleTable:
    def __init__(self) -> None:
        self.priorities: dict[str, float] = {}
        self.agent_priorities: dict[tuple[str, str], float] = {}
        self.routes: dict[tuple[str, str], str] = {}
        self.pins: dict[tuple[str, str], str] = {}  # stateful: set by the router, never moved
        self.weights: dict[str, tuple[tuple[str, ...], tuple[float, ...]]] = {}
        # session -> the agent types it has keyed rules for, so forgetting it is no scan
        self._keyed: dict[str, set[str]] = {}

    def priority(self, session_id: str, agent_type: str) -> float:
        if self.agent_priorities:
            value = self.agent_priorities.get((session_id, agent_type))
            if value is not None:
                return value
        return self.priorities.get(session_id, 0.0)

    def install(self, d: Route | WeightedRoute | SetPriority) -> str | None:
        """Apply one rule; returns the session whose queued calls need re-ordering."""
        if isinstance(d, Route):
            if d.instance_id is None:
                self.routes.pop((d.session_id, d.agent_type), None)
            else:
                self.routes[(d.session_id, d.agent_type)] = d.instance_id
                self._key(d.session_id, d.agent_type)
            return None
        if isinstance(d, WeightedRoute):
            self.weights[d.agent_type] = (d.instances, d.weights)
            return None
        if d.agent_type is None:
            if d.value == 0.0:
                self.priorities.pop(d.session_id, None)
            else:
                self.priorities[d.session_id] = d.value
        else:
            self.agent_priorities[(d.session_id, d.agent_type)] = d.value
            self._key(d.session_id, d.agent_type)
        return d.session_id

    def pin(self, session_id: str, agent_type: str, instance_id: str) -> None:
        """A stateful agent's session stays on `instance_id` (the router's choice)."""
        self.pins[(session_id, agent_type)] = instance_id
        self._key(session_id, agent_type)

    def _key(self, session_id: str, agent_type: str) -> None:
        mine = self._keyed.get(session_id)
        if mine is None:
            self._keyed[session_id] = {agent_type}
        else:
            mine.add(agent_type)

    def weighted(self, agent_type: str, usable: Callable[[str], bool],
                 load: Callable[[str], int]) -> str | None:
        """The usable instance of a weighted route with the least load per unit of
        weight: picks follow the weights, yet a backed-up instance is passed over."""
        entry = self.weights.get(agent_type)
        if entry is None:
            return None
        best: str | None = None
        best_cost = 0.0
        for inst, w in zip(*entry, strict=True):
            if w <= 0 or not usable(inst):
                continue
            cost = (load(inst) + 1) / w
            if best is None or cost < best_cost:
                best, best_cost = inst, cost
        return best

    def forget_session(self, session_id: str) -> None:
        self.priorities.pop(session_id, None)
        for agent_type in self._keyed.pop(session_id, ()):
            key = (session_id, agent_type)
            for table in (self.agent_priorities, self.routes, self.pins):
                table.pop(key, None)

    def forget_instance(self, instance_id: str) -> None:
        for key in [k for k, v in self.routes.items() if v == instance_id]:
            del self.routes[key]
        for agent_type, (instances, weights) in list(self.weights.items()):
            if instance_id in instances:
                keep = [(i, w) for i, w in zip(instances, weights, strict=True)
                        if i != instance_id]
                if keep:
                    self.weights[agent_type] = (tuple(i for i, _ in keep),
                                                tuple(w for _, w in keep))
                else:
                    del self.weights[agent_type]

    def snapshot(self) -> Rules:
        return Rules(dict(self.priorities), dict(self.agent_priorities), dict(self.routes),
                     dict(self.pins), dict(self.weights))
