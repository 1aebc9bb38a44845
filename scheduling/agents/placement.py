"""Where a new agent call runs (the event-driven half of routing), in order:
a stateful agent's session pin; the session's installed route; the agent type's
weighted route; else the least-loaded live instance, growing the type up to its
`max_instances` when `grow_on_demand` and no instance is idle. A weighted route
picks the usable instance with the least load per unit of weight. Least-loaded comes
from the type's load index (scheduling/agents/load.py): no pass over the instances.
"""

from __future__ import annotations

from scheduling.agents.instances import EXTERNAL, Instances
from scheduling.agents.policy import Directives
from scheduling.agents.resources import NoCapacity


class Placement(Instances):
    """A layer of `Cluster` (cluster.py)."""

    def __init__(self, grow_on_demand: bool) -> None:
        self.grow_on_demand = grow_on_demand

    def place(self, agent_type: str, session_id: str) -> tuple[str, str]:
        return self._place(agent_type, session_id, self.agents[agent_type])

    def _place(self, agent_type: str, session_id: str, directives: Directives,
               grow: bool = True) -> tuple[str, str]:
        """`grow` False: on an instance there is, never on a new one."""
        rules = self.rules
        if directives.stateful:
            key = (session_id, agent_type)
            pinned = rules.pins.get(key)
            if pinned is not None and self._usable(pinned):
                return pinned, "stateful session pin"
            chosen = self._least_loaded(agent_type, directives, grow)
            rules.pin(session_id, agent_type, chosen)
            return chosen, "stateful: pinned to the least loaded"
        if rules.routes:
            routed = rules.routes.get((session_id, agent_type))
            if routed is not None and self._usable(routed):
                return routed, "session route"
        if agent_type in rules.weights:
            weighted = rules.weighted(agent_type, self._usable, self._load)
            if weighted is not None:
                return weighted, "weighted route"
        return self._least_loaded(agent_type, directives, grow), "least loaded"

    def _least_loaded(self, agent_type: str, directives: Directives, grow: bool = True) -> str:
        index = self._index.get(agent_type)
        least = index.least() if index is not None else None
        if grow and (least is None or (least[1] > 0 and self.grow_on_demand
                                       and len(index or ()) < directives.max_instances)):
            problem = self.room_for(agent_type)
            if problem is None:
                return self.add_instance(agent_type, reason="on demand").id
            if least is None:
                raise NoCapacity(f"no live instance of {agent_type} and none can start: "
                                 f"{problem}")
        if least is None:
            raise NoCapacity(f"no live instance of {agent_type}, and calls of other agents "
                             f"have waited longer for room")
        return least[0]

    def _try_place(self, agent_type: str, session_id: str, directives: Directives,
                   grow: bool) -> tuple[str, str] | None:
        try:
            return self._place(agent_type, session_id, directives, grow)
        except NoCapacity:
            return None

    def _locate(self, creator: str, dep: str) -> str:
        known = self.controllers[creator].directory.get(dep) if creator in self.controllers \
            else None
        if known is not None:
            return known
        meta = self._meta.get(dep)
        return meta.placed if meta is not None else EXTERNAL
