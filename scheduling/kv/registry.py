"""Built-in KV policies by name."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import fields, replace
from typing import Any

from scheduling.kv.agentd import AgentdOptions, AgentdPolicy
from scheduling.kv.autellix import AutellixPlasPolicy
from scheduling.kv.baselines import ContinuumTtlPolicy, StickyPolicy, VllmDefaultPolicy
from scheduling.kv.policy import KvPolicy
from scheduling.kv.prefix_router import PrefixRouterPolicy
from scheduling.kv.thunder import ThunderAgentPolicy

KV_POLICIES: dict[str, Callable[[], KvPolicy]] = {
    VllmDefaultPolicy.name: VllmDefaultPolicy,
    StickyPolicy.name: StickyPolicy,
    ContinuumTtlPolicy.name: ContinuumTtlPolicy,
    ThunderAgentPolicy.name: ThunderAgentPolicy,
    AutellixPlasPolicy.name: AutellixPlasPolicy,
    PrefixRouterPolicy.name: PrefixRouterPolicy,
    AgentdPolicy.name: AgentdPolicy,
}


def make_kv_policy(name: str, options: Mapping[str, Any] | None = None) -> KvPolicy:
    """The built-in `name`; `options` ([kv_options] in the config) tune agentd's."""
    try:
        factory = KV_POLICIES[name]
    except KeyError:
        raise KeyError(f"unknown kv policy {name!r}; known: {sorted(KV_POLICIES)}") from None
    if options:
        return AgentdPolicy(agentd_options(name, options))
    return factory()


def agentd_options(policy: str, options: Mapping[str, Any]) -> AgentdOptions:
    """`AgentdOptions` with `options` set; ValueError naming the first one that is wrong."""
    if policy != AgentdPolicy.name:
        raise ValueError(f"kv_options tune the {AgentdPolicy.name} policy; kv_policy is {policy}")
    base = AgentdOptions()
    known = {f.name for f in fields(base)}
    values: dict[str, Any] = {}
    for key, value in options.items():
        if key not in known:
            raise ValueError(f"kv_options.{key} is unknown; known: {', '.join(sorted(known))}")
        want = type(getattr(base, key))
        fits = (isinstance(value, bool) if want is bool
                else isinstance(value, int) and not isinstance(value, bool) if want is int
                else isinstance(value, int | float) and not isinstance(value, bool))
        if not fits:
            kind = {bool: "true or false", int: "an integer"}.get(want, "a number")
            raise ValueError(f"kv_options.{key} must be {kind}, got {value!r}")
        values[key] = want(value)
    return replace(base, **values)
