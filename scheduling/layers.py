"""The five scheduling layers' policy interfaces, in one place, and the meta and admission
layers' built-ins.

Operator policies subclass these (policy code may import only ``scheduling.*``, so the
interfaces live here rather than in the daemon). Each is defined next to the code it
plugs into and re-exported here:

- ``KvPolicy`` (medium loop, scheduling/kv/policy.py): ``decide`` pauses and restores,
  ``route`` places a ready request's program, ``on_request_end``.
- ``OrderingPolicy`` (fast step, scheduling/slo/ordering.py): the order of the global
  queue (``push``, ``peek``, ``pop``, ``rebuild``).
- ``MetaPolicy`` (slow loop, scheduling/slo/meta.py, so that scheduling.slo.meta_llm's
  ``LlmMeta`` can build on it): ``choose`` the ordering policy from the long view. The
  daemon wraps it in ``scheduling.slo.meta.MetaLoop``, which adds the rollback guard and
  the emergency bypass unless the policy sets ``guards = False``.
- ``AdmissionPolicy`` (medium loop and per dispatch, below): ``controls`` once per
  scheduling cycle per worker, ``admit`` for the head of the queue before each dispatch.
  The fence (the ledger of KV reserved by running requests) belongs to the caller and
  outlives a policy swap; a policy reads it and must not change it.
- ``ControlPolicy`` (NALAR's global controller, scheduling/agents/policy.py): route,
  set_priority, migrate, kill, provision agent instances.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import ClassVar

# Re-exported: every layer's interface is importable from here.
from scheduling.agents.policy import ControlPolicy as ControlPolicy
from scheduling.kv.policy import KvPolicy as KvPolicy
from scheduling.slo.admission import (
    AdmissionDecision,
    AdmissionFence,
    Band,
    ConcurrencyController,
    ExecutionControls,
    StateraAgent,
    TokenBudgetController,
    kv_demand,
)
from scheduling.slo.meta import ContextualBandit, Decision, MetaPolicy, RuleMap, RuleThresholds
from scheduling.slo.meta_llm import LlmMeta
from scheduling.slo.ordering import OrderingPolicy as OrderingPolicy
from scheduling.slo.prediction import QueuedRequest
from scheduling.slo.views import LongView

BANDIT_ARMS = ("fcfs", "sjf", "edf", "two_lane")
# Nominal per-cycle token budget for the P-loop's range: the engines behind the daemon take
# no per-cycle budget (vLLM fixes max_num_batched_tokens at start), so it is advisory.
NOMINAL_TOKEN_BUDGET = 8192


class RulesMeta(MetaPolicy):
    """The rule map: failure pattern -> policy (scheduling.slo.meta.RuleMap)."""

    name = "meta-rules"

    def __init__(self, thresholds: RuleThresholds | None = None, initial: str = "fcfs") -> None:
        self.rules = RuleMap(initial, thresholds)

    def choose(self, view: LongView, now: float) -> Decision:
        return self.rules.choose(view, now)

    def on_applied(self, policy_name: str) -> None:
        self.rules.on_applied(policy_name)


class BanditMeta(MetaPolicy):
    """UCB1 over a few arms with ESG as the reward (scheduling.slo.meta.ContextualBandit)."""

    name = "meta-bandit"

    def __init__(self, arms: Sequence[str] = BANDIT_ARMS) -> None:
        self.bandit = ContextualBandit(arms)

    def choose(self, view: LongView, now: float) -> Decision:
        return self.bandit.choose(view, now)

    def on_applied(self, policy_name: str) -> None:
        self.bandit.on_applied(policy_name)


class KeepMeta(MetaPolicy):
    """No meta controller: the ordering policy an operator activated stays, unguarded."""

    name = "meta-off"
    guards = False

    def __init__(self) -> None:
        self.current = ""

    def choose(self, view: LongView, now: float) -> Decision:
        return Decision(self.current, "meta controller off")

    def on_applied(self, policy_name: str) -> None:
        self.current = policy_name


META_POLICIES: dict[str, type[MetaPolicy]] = {
    p.name: p for p in (RulesMeta, BanditMeta, KeepMeta, LlmMeta)}


class AdmissionPolicy(ABC):
    """The stability agent: execution controls per worker, and admission of the head."""

    name: ClassVar[str]

    @abstractmethod
    def controls(self, worker: str, utilisation: float, n_max: int,
                 bypass: bool) -> ExecutionControls:
        """Once per scheduling cycle per healthy worker. ``utilisation`` is its
        window-averaged KV utilisation, ``n_max`` its engine's batch limit."""

    @abstractmethod
    def admit(self, request: QueuedRequest, worker: str, fence: AdmissionFence,
              controls: ExecutionControls) -> AdmissionDecision:
        """Whether ``request`` may start on ``worker`` now."""


class StateraAdmission(AdmissionPolicy):
    """Conformal KV fence (Eq. 2) plus the P/I loops, one agent per worker."""

    name = "statera"

    def __init__(self, band: Band = Band(0.5, 0.9), n_min: int = 4) -> None:
        self.band, self.n_min = band, n_min
        self.agents: dict[str, StateraAgent] = {}

    def controls(self, worker: str, utilisation: float, n_max: int,
                 bypass: bool) -> ExecutionControls:
        agent = self.agents.get(worker)
        if agent is None or agent.concurrency.n_max != n_max:
            agent = self.agents[worker] = self._agent(max(1, n_max))
        return agent.step(utilisation, bypass)

    def _agent(self, n_max: int) -> StateraAgent:
        budget = NOMINAL_TOKEN_BUDGET
        return StateraAgent(
            self.band,
            TokenBudgetController(budget // 16, budget, eta=float(budget)),
            ConcurrencyController(min(self.n_min, n_max), n_max, eta=n_max / 4),
        )

    def admit(self, request: QueuedRequest, worker: str, fence: AdmissionFence,
              controls: ExecutionControls) -> AdmissionDecision:
        return fence.decide(request, worker, controls)


class UnboundedAdmission(AdmissionPolicy):
    """Admit everything: the engine's own queue does the waiting (vLLM's behaviour)."""

    name = "unbounded"

    def controls(self, worker: str, utilisation: float, n_max: int,
                 bypass: bool) -> ExecutionControls:
        return ExecutionControls(NOMINAL_TOKEN_BUDGET, n_max, unbounded=True)

    def admit(self, request: QueuedRequest, worker: str, fence: AdmissionFence,
              controls: ExecutionControls) -> AdmissionDecision:
        return AdmissionDecision(request.request_id, worker, True, "admission unbounded",
                                 kv_demand(request), fence.reserved(worker), float("inf"))


ADMISSION_POLICIES = {p.name: p for p in (StateraAdmission, UnboundedAdmission)}
