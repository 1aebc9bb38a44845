"""Built-in `control` layer policies by name (see scheduling/agents/policy.py, ControlPolicy).

`nalar-default` is the three policies NALAR's evaluation runs together: load-balanced
routing, head-of-line migration, resource reassignment.
"""

from __future__ import annotations

from collections.abc import Callable

from scheduling.agents.cluster import Cluster
from scheduling.agents.policies.hol_migration import HeadOfLineMigration
from scheduling.agents.policies.load_balance import LoadBalanced
from scheduling.agents.policies.lpt_retries import LptRetries
from scheduling.agents.policies.reassign import ResourceReassignment
from scheduling.agents.policies.srtf_stage import SrtfByStage
from scheduling.agents.policy import Combined, ControlPolicy, ControlView, Directives, SetPriority


def nalar_default() -> ControlPolicy:
    return Combined(LoadBalanced(), HeadOfLineMigration(), ResourceReassignment(),
                    name="nalar-default")


class StaticRouting(Combined):
    """No global decisions: placement stays with the local least-loaded rule."""

    name = "static"


CONTROL_POLICIES: dict[str, Callable[[], ControlPolicy]] = {
    "nalar-default": nalar_default,
    LoadBalanced.name: LoadBalanced,
    HeadOfLineMigration.name: HeadOfLineMigration,
    ResourceReassignment.name: ResourceReassignment,
    SrtfByStage.name: SrtfByStage,
    LptRetries.name: LptRetries,
    StaticRouting.name: StaticRouting,
}


def sample_view(now: float) -> ControlView:
    """A small fixed view built by real local controllers, so that a policy can be
    dry-run (validated) even when no workflow runs: a busy and an idle instance of one
    agent, a stateful agent with a pinned session, queued and waiting calls, a retry."""
    c = Cluster({"Dev": Directives(max_instances=3), "Chat": Directives(stateful=True)})
    for agent in ("Dev", "Dev", "Chat"):
        c.add_instance(agent, now=now - 60)
    c.apply([SetPriority("s1", 1.0)], now - 5)
    c.create("f1", "s1", "Dev", now - 5, call_key="task-a")
    c.create("f2", "s1", "Dev", now - 4, deps=["f1"])
    c.create("f3", "s2", "Dev", now - 3, call_key="task-a")
    c.create("f4", "s2", "Chat", now - 2)
    for inst in ("Dev#0", "Chat#0"):
        c.start_next(inst, now - 1)
    c.create("f5", "s3", "Dev", now - 1, call_key="task-a")
    return c.view(now)


def make_control_policy(name: str) -> ControlPolicy:
    try:
        factory = CONTROL_POLICIES[name]
    except KeyError:
        raise KeyError(f"unknown control policy {name!r}; known: {sorted(CONTROL_POLICIES)}") \
            from None
    return factory()


__all__ = ["CONTROL_POLICIES", "HeadOfLineMigration", "LoadBalanced", "LptRetries",
           "ResourceReassignment", "SrtfByStage", "StaticRouting", "make_control_policy",
           "nalar_default", "sample_view"]
