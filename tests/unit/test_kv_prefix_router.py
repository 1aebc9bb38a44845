"""The cache-aware prefix router: longest cached prefix unless the loads are imbalanced."""

from __future__ import annotations

from scheduling.kv import (
    Admit,
    KvView,
    PrefixRouterPolicy,
    ProgramView,
    Restore,
    WorkerView,
    make_kv_policy,
)
from scheduling.kv.prefix_router import cached_tokens
from tests.kv_programs import NOW, A, P, Q, R, prog


def view(*programs: ProgramView, used: tuple[int, ...] = (0, 0), cap: int = 1000) -> KvView:
    workers = tuple(WorkerView(f"w{i}", cap, u) for i, u in enumerate(used))
    return KvView(workers, programs)


def test_a_program_follows_its_cached_context_while_loads_are_balanced() -> None:
    v = view(prog("a", A, 300, worker="w1"), used=(400, 450))
    assert PrefixRouterPolicy().route(v, "a", NOW) == "w1"


def test_a_known_evicted_program_goes_to_the_least_loaded() -> None:
    cold = prog("a", P, 300, worker="w1", pending_request=True, kv_resident=False)
    warm = prog("a", P, 300, worker="w1", pending_request=True, kv_resident=True)
    unknown = prog("a", P, 300, worker="w1", pending_request=True)
    assert PrefixRouterPolicy().route(view(cold, used=(400, 450)), "a", NOW) == "w0"
    assert PrefixRouterPolicy().route(view(warm, used=(400, 450)), "a", NOW) == "w1"
    assert PrefixRouterPolicy().route(view(unknown, used=(400, 450)), "a", NOW) == "w1"


def test_the_cache_events_say_how_much_of_the_context_is_still_there() -> None:
    mostly = prog("a", P, 300, worker="w1", pending_request=True, kv_cached_tokens=250)
    little = prog("a", P, 300, worker="w1", pending_request=True, kv_cached_tokens=100)
    assert PrefixRouterPolicy().route(view(mostly, used=(400, 450)), "a", NOW) == "w1"
    # 100 of 300 tokens is under the match threshold: the least loaded
    assert PrefixRouterPolicy().route(view(little, used=(400, 450)), "a", NOW) == "w0"


def test_imbalance_overrides_the_cache() -> None:
    # w1 is 0.4 of capacity fuller and over 1.5x w0: balance wins
    v = view(prog("a", A, 300, worker="w1"), used=(200, 600))
    assert PrefixRouterPolicy().route(v, "a", NOW) == "w0"


def test_a_new_program_follows_its_prefix_group_when_the_prefix_is_most_of_it() -> None:
    member = prog("m", R, 500, worker="w1", prefix_group="sys", prefix_tokens=400)
    new = prog("n", Q, 500, prefix_group="sys", prefix_tokens=400)
    short = prog("s", Q, 500, prefix_group="sys", prefix_tokens=100)
    v = view(member, new, short, used=(300, 350))
    assert cached_tokens(v, new, "w1") == 400 and cached_tokens(v, new, "w0") == 0
    assert PrefixRouterPolicy().route(v, "n", NOW) == "w1"
    # 100 of 500 tokens cached is under the 0.5 match threshold: the least loaded
    assert PrefixRouterPolicy().route(v, "s", NOW) == "w0"


def test_decide_admits_every_waiting_program_counting_what_it_sent() -> None:
    q1, q2 = prog("q1", Q, 300, ready_since=NOW - 2), prog("q2", Q, 300, ready_since=NOW - 1)
    back = prog("b", P, 200, worker="w1", pending_request=True, ready_since=NOW)
    v = view(q1, q2, back, used=(0, 0))
    assert PrefixRouterPolicy().decide(v, NOW) == [
        Admit("q1", "w0", "prefix-route"), Admit("q2", "w1", "prefix-route"),
        Restore("b", "w1", "prefix-route")]


def test_selectable_by_name() -> None:
    assert make_kv_policy("prefix-router").name == "prefix-router"
