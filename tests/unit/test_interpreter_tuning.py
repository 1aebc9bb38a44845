"""The daemon's collector settings: survivors age out of the collector's sight, cyclic
garbage among them waits for a thaw, and stopping gives everything back."""

from __future__ import annotations

import gc
import sys
import weakref
from collections.abc import Iterator

import pytest

from daemon.core.interpreter_tuning import (
    FULL_AFTER_YOUNG,
    SWITCH_INTERVAL_S,
    Ageing,
    release_on_stop,
    settle_after_startup,
)


class Node:
    def __init__(self) -> None:
        self.me = self  # a reference cycle: only the collector frees it


@pytest.fixture
def ageing() -> Iterator[Ageing]:
    """A thaw once the heap has grown by 60,000 allocator blocks."""
    gc.collect()
    gc.freeze()
    watch = Ageing(growth=1.0, floor=60_000)
    gc.callbacks.append(watch)
    try:
        yield watch
    finally:
        gc.callbacks.remove(watch)
        gc.unfreeze()


def test_settle_freezes_startup_and_release_gives_it_all_back() -> None:
    thresholds, interval = gc.get_threshold(), sys.getswitchinterval()
    before = settle_after_startup()
    try:
        assert gc.get_freeze_count() > 0
        assert gc.get_threshold()[2] == FULL_AFTER_YOUNG
        assert sys.getswitchinterval() == SWITCH_INTERVAL_S
        assert before.ageing in gc.callbacks
    finally:
        release_on_stop(before)
    assert gc.get_freeze_count() == 0 and before.ageing not in gc.callbacks
    assert (gc.get_threshold(), sys.getswitchinterval()) == (thresholds, interval)


def test_a_middle_collections_survivors_are_frozen_a_young_ones_are_not(
        ageing: Ageing) -> None:
    start = gc.get_freeze_count()
    kept = [[i] for i in range(300)]
    gc.collect(0)
    assert gc.get_freeze_count() == start  # still young: it may die in a cycle soon
    gc.collect(1)
    assert gc.get_freeze_count() >= start + len(kept)
    assert all(o is not kept[0] for o in gc.get_objects(generation=2))
    assert ageing.thaws == 0


def test_frozen_cyclic_garbage_waits_for_the_thaw(ageing: Ageing) -> None:
    nodes = [Node() for _ in range(400)]
    alive = weakref.ref(nodes[0])
    gc.collect(1)  # the nodes survive it: frozen
    del nodes
    gc.collect(2)
    assert alive() is not None  # garbage, but frozen: the collector does not see it
    assert ageing.thaws == 0
    more = [Node() for _ in range(30_000)]  # an object and its dict each
    gc.collect(1)  # the heap is now past the bound: all is unfrozen
    assert ageing.thaws == 1 and ageing.thawing and gc.get_freeze_count() == 0
    gc.collect(1)
    assert ageing.thawing and gc.get_freeze_count() == 0  # waits for the full walk
    gc.collect(2)
    assert alive() is None  # the full walk freed the old cycles
    assert not ageing.thawing and gc.get_freeze_count() >= len(more)
    assert ageing.bound >= sys.getallocatedblocks() + 60_000 - 1_000
