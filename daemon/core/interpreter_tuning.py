"""Interpreter settings for the daemon process, applied once it has started, so that the
event loop, which every dispatch waits on, is not held by the interpreter itself.

Garbage collection. A collection runs inside whatever the loop is doing and stops it:
no dispatch until it ends. Under bench/policy_swap.py's load the full (generation 2)
collections took 180-270 ms each, nearly all of it walking objects made at startup
(modules, the app, the ORM's mappers, the policies' classes) that live as long as the
process and are never garbage. So, once startup is over:
- `gc.freeze()` moves everything alive then out of the collector's sight: later
  collections walk only what was made while serving;
- full collections wait for 10x more young collections than the interpreter's default
  (`FULL_AFTER_YOUNG`): what serving keeps alive (requests for 30 s, the SLO windows'
  records for 60 s) is long-lived but rarely cyclic, so walking it every few seconds
  frees little; reference counting frees the rest at once.
The young generations keep the interpreter's thresholds: a larger first threshold makes
the middle collections walk more survivors at once, a longer pause, not a shorter one.

Ageing out. Even so, what serving made piles up in the old generation, and a full
collection walked it all: 134 ms, twice in a 3-minute run of the benchmark; in another,
212,000 objects and 146 ms of CPU (requests kept 30 s with their queues and events, the
SLO windows' records, the classes of stored policy versions). So `Ageing` freezes what survives
each middle or full collection too: a full collection then walks only what was
promoted since the last one, and reference counting still frees a frozen object the
moment it is let go. What it cannot free is a frozen object in a reference cycle that
becomes garbage later; those wait (under the benchmark's load, 54 objects after two
minutes). To bound them, once the heap (the allocator's blocks in use) has grown to
`THAW_GROWTH` times what it was after the last full walk, and by `THAW_FLOOR` blocks at
least (what a busy daemon keeps alive while serving is as large as what startup made:
160,000 objects, about 650,000 blocks, at startup; 210,000 objects more under the
benchmark's load), everything is unfrozen, the next full collection walks it all once
(the pause above, rare: the heap must double), and freezing resumes after it with a new
bound. The heap is measured rather than the frozen objects counted: counting walks
them all (`gc.get_freeze_count()`: 9-25 ms for 120,000-240,000 objects), reading the
allocator's count takes tens of microseconds.

GIL hand-over. The loop shares the GIL with the store's writer thread (aiosqlite runs
SQLAlchemy's statements there). Each time the loop blocks in a call that releases the
GIL (a ZeroMQ send to a worker, a socket write), a thread with Python work can take it,
and the loop then waits up to the switch interval to get it back: 5 ms by default, in
the middle of a dispatch (under the benchmark's load py-spy finds the ZeroMQ send in
most of a chat request's samples on the loop). With one thread spinning Python code, a
0.2 ms blocking call took 5.4 ms at the median with the default interval and 1.4 ms
with `SWITCH_INTERVAL_S` (1 ms) on the 2-core development machine. A forced switch
costs microseconds, so the other threads lose little.

When the app stops, `release_on_stop` gives the frozen objects and the settings back, so
a process that runs the app more than once (the tests) keeps none of it.
"""

from __future__ import annotations

import gc
import logging
import sys
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("agentd")

FULL_AFTER_YOUNG = 100  # the interpreter's default third threshold is 10
SWITCH_INTERVAL_S = 0.001  # the interpreter's default is 0.005
THAW_GROWTH = 2.0
THAW_FLOOR = 2_000_000  # allocator blocks, about 500,000 objects


class Ageing:
    """A `gc.callbacks` entry: freezes the survivors of each middle or full collection,
    and unfreezes everything once for a full walk when the heap has grown `growth`
    times, and by `floor` allocator blocks at least, since the last one."""

    def __init__(self, growth: float = THAW_GROWTH, floor: int = THAW_FLOOR) -> None:
        self.growth, self.floor = growth, floor
        self.bound = self._bound()
        self.thawing = False
        self.thaws = 0

    def _bound(self) -> float:
        heap = sys.getallocatedblocks()
        return max(self.growth * heap, heap + self.floor)

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        generation = info["generation"]
        if phase != "stop" or generation == 0:
            return  # a young collection's survivors are still young: they may die in a cycle
        if self.thawing:
            if generation < 2:
                return  # keep it all in sight until the full collection has walked it
            self.thawing = False
            gc.freeze()
            self.bound = self._bound()
            return
        # Both younger generations were just emptied into the old one: this freezes the
        # old generation's newcomers, nothing younger.
        gc.freeze()
        heap = sys.getallocatedblocks()
        if heap >= self.bound:
            gc.unfreeze()
            self.thawing, self.thaws = True, self.thaws + 1
            log.debug("heap at %d blocks: unfrozen for one full collection", heap)


@dataclass(frozen=True)
class Before:
    thresholds: tuple[int, int, int]
    switch_interval_s: float
    ageing: Ageing | None = field(default=None, compare=False)


def settle_after_startup() -> Before:
    """Collect what startup left, freeze the survivors, slow full collections, age
    survivors out of the collector's sight and shorten the GIL's switch interval;
    returns what was set before."""
    thresholds, interval = gc.get_threshold(), sys.getswitchinterval()
    gc.collect()
    gc.freeze()
    ageing = Ageing()
    gc.callbacks.append(ageing)
    gc.set_threshold(thresholds[0], thresholds[1], FULL_AFTER_YOUNG)
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    log.debug("%d startup objects frozen; gc thresholds %s; switch interval %s s",
              gc.get_freeze_count(), gc.get_threshold(), SWITCH_INTERVAL_S)
    return Before(thresholds, interval, ageing)


def release_on_stop(before: Before) -> None:
    if before.ageing in gc.callbacks:
        gc.callbacks.remove(before.ageing)
    gc.unfreeze()
    gc.set_threshold(*before.thresholds)
    sys.setswitchinterval(before.switch_interval_s)
