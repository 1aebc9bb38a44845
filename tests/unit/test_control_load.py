"""Least-loaded placement without a pass over the instances (scheduling/agents/load.py):
the index agrees with a brute-force minimum under any sequence of changes, serves equal
loads round-robin, and the cluster's placement through it stays least-loaded."""

from __future__ import annotations

import random

from hypothesis import given
from hypothesis import strategies as st

from scheduling.agents.cluster import Cluster
from scheduling.agents.load import LoadIndex
from scheduling.agents.policy import Directives, Kill


def test_equal_loads_are_served_in_turn() -> None:
    index = LoadIndex()
    for name in ("a", "b", "c"):
        index.add(name, 0)
    picks = []
    for _ in range(6):
        least = index.least()
        assert least is not None
        picks.append(least[0])
        index.set(least[0], least[1] + 1)
    assert picks == ["a", "b", "c", "a", "b", "c"]


def test_steps_up_past_gaps_and_down_on_removal() -> None:
    index = LoadIndex()
    index.add("a", 0)
    index.add("b", 5)
    index.set("a", 9)  # the lowest bucket empties: the next one up is 5, not 1
    assert index.least() == ("b", 5)
    index.remove("b")
    assert index.least() == ("a", 9)
    index.remove("a")
    assert index.least() is None and len(index) == 0
    index.add("c", 3)
    assert index.least() == ("c", 3)


op = st.tuples(st.sampled_from(("add", "remove", "set", "set", "set")),
               st.integers(0, 5), st.integers(0, 8))


@given(st.lists(op, max_size=200))
def test_least_is_always_a_true_minimum(ops: list[tuple[str, int, int]]) -> None:
    index = LoadIndex()
    truth: dict[str, int] = {}
    for name, i, load in ops:
        inst = f"i{i}"
        if name == "add":
            index.add(inst, load)
            truth[inst] = load
        elif name == "remove":
            index.remove(inst)
            truth.pop(inst, None)
        elif inst in truth:
            index.set(inst, load)
            truth[inst] = load
        least = index.least()
        if not truth:
            assert least is None
        else:
            assert least is not None and truth[least[0]] == least[1] == min(truth.values())
        assert len(index) == len(truth)


def test_cluster_places_on_a_least_loaded_live_instance() -> None:
    rng = random.Random(7)
    c = Cluster({"W": Directives(max_instances=6)}, record_events=False)
    for _ in range(4):
        c.add_instance("W")
    running: list[tuple[str, str]] = []
    for n in range(400):
        lowest = min(len(x.held) for x in c.alive("W"))
        placed = c.create(f"f{n}", f"s{n % 9}", "W", 0.0)
        assert len(c.controllers[placed].held) - 1 == lowest
        roll = rng.random()
        if roll < 0.5:
            inst = rng.choice([x.id for x in c.alive("W")])
            started = c.start_next(inst, 0.0)
            if started is not None:
                running.append((inst, started.future.future_id))
        elif roll < 0.9 and running:
            inst, fid = running.pop(rng.randrange(len(running)))
            c.finish(inst, fid, None, True, 0.0)
        elif roll < 0.95 and len(c.alive("W")) > 2:
            c.apply([Kill(rng.choice([x.id for x in c.alive("W")]))], 0.0)
        else:
            c.add_instance("W")


def test_positional_view_builder_matches_the_named_fields() -> None:
    """The per-call path builds a FutureView by position; a field added to FutureView
    must show up here, not as a silently shifted view."""
    from scheduling.agents.cluster import _future
    from scheduling.agents.policy import FutureStatus, FutureView

    built = _future("f", "s", "A", "A#0", 1.5, 7, "driver", ("d",), 2, 1, 3)
    named = FutureView("f", "s", "A", "A#0", FutureStatus.WAITING, 1.5, seq=7,
                       creator="driver", dependencies=("d",), stage=2, attempt=1, turn=3)
    assert built == named and len(built) == len(FutureView._fields)
