"""A move across nodes is a full recompute: KV never travels between machines."""

from __future__ import annotations

from typing import Any

from scheduling.kv import AgentdOptions, AgentdPolicy, KvView, Restore, WorkerView, plan_migration
from tests.kv_programs import NOW, A, P, R, prog

GROUP: dict[str, Any] = {"prefix_group": "sys", "prefix_tokens": 300}


def nodes(*programs: Any, w0: str = "node-a", w1: str = "node-a") -> KvView:
    return KvView((WorkerView("w0", 1000, 0, node=w0), WorkerView("w1", 1000, 0, node=w1)),
                  programs)


def test_a_move_on_the_same_node_keeps_the_prefix_held_on_the_target() -> None:
    v = nodes(prog("a", A, 400, kv_node="node-a", **GROUP),
              prog("b", R, 350, worker="w1", kv_node="node-a", **GROUP))
    assert plan_migration(v, "a", "w1", now=True).recompute_tokens == 100


def test_a_move_to_another_node_recomputes_the_whole_context() -> None:
    v = nodes(prog("a", A, 400, kv_node="node-a", **GROUP),
              prog("b", R, 350, worker="w1", kv_node="node-b", **GROUP), w1="node-b")
    assert plan_migration(v, "a", "w1", now=True).recompute_tokens == 400


def test_its_own_worker_restarted_on_another_node_holds_none_of_its_kv() -> None:
    # w0 kept its id but now runs on node-b (a Ray actor restarted elsewhere): the blocks
    # the residency estimate still counts as cached stayed on node-a.
    paused = prog("p", P, 400, kv_resident=True, kv_node="node-a")
    assert plan_migration(nodes(paused), "p", "w0").recompute_tokens == 0
    assert plan_migration(nodes(paused, w0="node-b"), "p", "w0").recompute_tokens == 400


def test_agentd_restores_where_the_least_is_recomputed_counting_nodes() -> None:
    def restore(w0: str) -> list[Any]:
        paused = prog("p", P, 400, kv_resident=True, kv_node="node-a", pending_request=True,
                      ready_since=NOW - 1, **GROUP)
        holder = prog("b", A, 350, worker="w1", kv_node="node-a", **GROUP)
        policy = AgentdPolicy(AgentdOptions(share_prefix=True))
        return policy.decide(nodes(paused, holder, w0=w0), NOW)

    assert Restore("p", "w0", "restore") in restore(w0="node-a")  # cached at home
    # Home moved to node-b: w1, still on node-a with the shared prefix, recomputes 100.
    assert Restore("p", "w1", "restore") in restore(w0="node-b")


def test_unknown_nodes_never_count_as_a_crossing() -> None:
    v = nodes(prog("a", A, 400, **GROUP), prog("b", R, 350, worker="w1", **GROUP),
              w0="", w1="")
    assert not v.crosses_node(v.program("a"), "w1")
    assert plan_migration(v, "a", "w1", now=True).recompute_tokens == 100
