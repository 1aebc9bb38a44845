"""Built-in KV policies by name."""

from __future__ import annotations

from collections.abc import Callable

from scheduling.kv.agentd import AgentdPolicy
from scheduling.kv.baselines import ContinuumTtlPolicy, StickyPolicy, VllmDefaultPolicy
from scheduling.kv.policy import KvPolicy
from scheduling.kv.thunder import ThunderAgentPolicy

KV_POLICIES: dict[str, Callable[[], KvPolicy]] = {
    VllmDefaultPolicy.name: VllmDefaultPolicy,
    StickyPolicy.name: StickyPolicy,
    ContinuumTtlPolicy.name: ContinuumTtlPolicy,
    ThunderAgentPolicy.name: ThunderAgentPolicy,
    AgentdPolicy.name: AgentdPolicy,
}


def make_kv_policy(name: str) -> KvPolicy:
    try:
        factory = KV_POLICIES[name]
    except KeyError:
        raise KeyError(f"unknown kv policy {name!r}; known: {sorted(KV_POLICIES)}") from None
    return factory()
