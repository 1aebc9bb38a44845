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
from dataclasses import dataclass

log = logging.getLogger("agentd")

FULL_AFTER_YOUNG = 100  # the interpreter's default third threshold is 10
SWITCH_INTERVAL_S = 0.001  # the interpreter's default is 0.005


@dataclass(frozen=True)
class Before:
    thresholds: tuple[int, int, int]
    switch_interval_s: float


def settle_after_startup() -> Before:
    """Collect what startup left, freeze the survivors, slow full collections and
    shorten the GIL's switch interval; returns what was set before."""
    before = Before(gc.get_threshold(), sys.getswitchinterval())
    gc.collect()
    gc.freeze()
    gc.set_threshold(before.thresholds[0], before.thresholds[1], FULL_AFTER_YOUNG)
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    log.debug("%d startup objects frozen; gc thresholds %s; switch interval %s s",
              gc.get_freeze_count(), gc.get_threshold(), SWITCH_INTERVAL_S)
    return before


def release_on_stop(before: Before) -> None:
    gc.unfreeze()
    gc.set_threshold(*before.thresholds)
    sys.setswitchinterval(before.switch_interval_s)
