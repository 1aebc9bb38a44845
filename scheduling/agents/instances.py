"""The cluster's instances: the registry of local controllers and their lifecycle.

An instance is provisioned (reserving its type's `resources` from the capacity, when
there is one), STARTING until activated when it loads something first, ACTIVE,
DRAINING once killed (its reservation given back at once), and DEAD when the last call
it held has left. Only ACTIVE instances are in their type's load index
(scheduling/agents/load.py), and `_set_state` is the one place that keeps it so.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from scheduling.agents.accounting import Accounting
from scheduling.agents.load import LoadIndex
from scheduling.agents.local import LocalController
from scheduling.agents.policy import DRIVER, Directives, InstanceState
from scheduling.agents.resources import NoCapacity, Resources, plus, shortfall
from scheduling.agents.rules import RuleTable

EXTERNAL = "external"  # holds calls the controllers do not run (tools), until they finish


class Instances(Accounting, ABC):
    """A layer of `Cluster` (cluster.py)."""

    def __init__(self, agents: dict[str, Directives] | None,
                 capacity: Resources | None) -> None:
        """`capacity`: what the instances may reserve in all (None: unbounded)."""
        self.rules = RuleTable()
        self.capacity = None if capacity is None else dict(capacity)
        self.reserved: dict[str, float] = {}
        self._holds: dict[str, Resources] = {}  # provisioned instance -> its reservation
        self.agents: dict[str, Directives] = dict(agents or {})
        self.controllers: dict[str, LocalController] = {
            name: LocalController(name, "", self.rules, executes=False)
            for name in (DRIVER, EXTERNAL)}
        self.by_type: dict[str, list[LocalController]] = {}
        self._numbers: dict[str, int] = {}
        self._index: dict[str, LoadIndex] = {}  # agent type -> its ACTIVE instances by load

    @abstractmethod
    def unpark(self, now: float) -> None:
        """Place the calls waiting for room (parking.py): an activation may make room."""

    def add_agent(self, agent_type: str, directives: Directives) -> None:
        self.agents[agent_type] = directives

    def add_instance(self, agent_type: str, instance_id: str | None = None, *,
                     node: str = "local", slots: int | None = None, reason: str = "",
                     starting: bool = False, now: float | None = None) -> LocalController:
        """NoCapacity: its reservation does not fit (nothing is added)."""
        directives = self.agents.setdefault(agent_type, Directives())
        problem = self.room_for(agent_type)
        if problem is not None:
            raise NoCapacity(problem)
        if slots is None:
            slots = max(1, directives.max_batch) if directives.batchable else 1
        if instance_id is None:
            n = self._numbers.get(agent_type, 0)
            self._numbers[agent_type] = n + 1
            instance_id = f"{agent_type}#{n}"
        if instance_id in self.controllers:
            raise ValueError(f"instance {instance_id!r} exists")
        c = LocalController(instance_id, agent_type, self.rules, node=node, slots=slots,
                            stateful=directives.stateful, now=now)
        self.controllers[instance_id] = c
        self.by_type.setdefault(agent_type, []).append(c)
        if directives.resources:
            self._holds[instance_id] = directives.resources
            self.reserved = plus(self.reserved, directives.resources)
        self._set_state(c, InstanceState.STARTING if starting else InstanceState.ACTIVE)
        self._event("instance.provisioned", instance=instance_id, agent_type=agent_type,
                    node=node, reason=reason)
        return c

    def room_for(self, agent_type: str) -> str | None:
        """Why one more instance of the type does not fit the capacity (None: it does)."""
        if self.capacity is None:
            return None
        need = self.agents.get(agent_type, Directives()).resources
        return shortfall(agent_type, need, self.reserved, self.capacity) if need else None

    def provision_startup(self, agent_type: str, n: int, now: float | None = None) -> int:
        """The type's `min_instances` at registration; the first that does not fit is
        refused as a `control.applied` event and ends the start-up. Returns how many
        were added."""
        for added in range(n):
            problem = self.room_for(agent_type)
            if problem is not None:
                self._event("control.applied", decision="Provision", ok=False, detail=problem,
                            agent_type=agent_type, node=None, reason="min_instances")
                return added
            self.add_instance(agent_type, reason="min_instances", now=now)
        return n

    def _release(self, instance_id: str) -> None:
        held = self._holds.pop(instance_id, None)
        if held is not None:
            self.reserved = plus(self.reserved, held, -1.0)

    def activate(self, instance_id: str, now: float | None = None) -> None:
        """A STARTING instance is ready to serve (and takes the calls waiting for one,
        given `now`)."""
        c = self.controllers[instance_id]
        if c.state_ is InstanceState.STARTING:
            self._set_state(c, InstanceState.ACTIVE)
            self._event("instance.active", instance=instance_id)
            if now is not None:
                self.unpark(now)

    def _set_state(self, c: LocalController, state: InstanceState) -> None:
        """The one place an instance changes state: only ACTIVE ones are in the index."""
        c.state_ = state
        index = self._index.get(c.agent_type)
        if index is None:
            index = self._index[c.agent_type] = LoadIndex()
        if state is InstanceState.ACTIVE:
            index.add(c.id, len(c.held))
            c.index = index
        else:
            index.remove(c.id)
            c.index = None

    def alive(self, agent_type: str) -> list[LocalController]:
        return [c for c in self.by_type.get(agent_type, ()) if c.state_ is InstanceState.ACTIVE]

    def _load(self, instance_id: str) -> int:
        return self.controllers[instance_id].load

    def _usable(self, instance_id: str) -> bool:
        c = self.controllers.get(instance_id)
        return c is not None and c.state_ is InstanceState.ACTIVE

    def _reap(self, c: LocalController) -> None:
        if c.state_ is InstanceState.DRAINING and not c.held:
            self._set_state(c, InstanceState.DEAD)
            self.by_type[c.agent_type].remove(c)
            self._event("instance.dead", instance=c.id)

    def _capacity(self) -> dict[str, Resources] | None:
        return None if self.capacity is None else {"": self.capacity}
