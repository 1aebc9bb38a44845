"""The swap benchmark's daemon-side stalls: a dispatchable request the daemon did not
dispatch, from the daemon probe's records (bench/daemon_probe/probe_intake.py,
probe_loop_watch.py), without the client's think time (in a dispatch gap) or its HTTP
write (in send-to-dispatch).

A request's daemon wait is the time it was the daemon's to move: from the loop's read
of its last byte to its dispatch when its own submit dispatched it; else (no worker took it
at once) from that read to its queueing, plus from the start of the pump that
dispatched it (a slot opened) to the dispatch. The time between, waiting for a slot,
is the admission and the workers' doing, reported apart (`slot_wait_ms`). A window's
daemon stall is the longest daemon wait that overlaps it. The loop lag says how late a
1 ms timer ran: what anything ready (a request's bytes, a worker's answer) waited
before the loop even read it, which the daemon wait cannot see.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import Counter
from collections.abc import Sequence
from typing import Any

from bench.policy_swap_report import STALL_TARGET_MS, random_windows, summary

Interval = tuple[float, float]


class Waits:
    """Intervals (start, end), searchable by overlap with a window."""

    def __init__(self, intervals: Sequence[Interval]) -> None:
        self.items = sorted(intervals, key=lambda i: i[1])
        self.ends = [b for _, b in self.items]
        self.longest = max((b - a for a, b in self.items), default=0.0)

    def longest_in(self, start: float, end: float) -> float:
        """The longest interval overlapping [start, end]; 0 when none does."""
        best = 0.0
        for a, b in self.items[bisect_left(self.ends, start):]:
            if b - self.longest > end:  # every later one starts after the window
                break
            if a <= end:
                best = max(best, b - a)
        return best


def request_waits(intake: Sequence[Sequence[Any]]) -> tuple[list[Interval], list[float]]:
    """(the daemon's wait intervals, seconds each dispatched-later request waited for a
    slot) from the probe's [arrived, queued, pump, dispatched, own, headers] records."""
    waits: list[Interval] = []
    slots: list[float] = []
    for arrived, queued, pump, dispatched, own, *_ in intake:
        if own:
            waits.append((arrived, dispatched))
            continue
        waits.append((arrived, queued))
        waits.append((pump, dispatched))
        slots.append(pump - queued)
    return waits, slots


def per_request(intake: Sequence[Sequence[Any]], phases: dict[str, Interval]) -> dict[str, Any]:
    """Each request's daemon wait (ms; its parts summed), by the phase it arrived in."""
    out: dict[str, Any] = {}
    for name, (a, b) in phases.items():
        mine = [r for r in intake if a <= r[0] <= b]
        waits = [1000 * ((r[3] - r[0]) if r[4] else (r[1] - r[0]) + (r[3] - r[2]))
                 for r in mine]
        slots = [1000 * (r[2] - r[1]) for r in mine if not r[4]]
        out[name] = {"daemon_wait_ms": summary(waits, 3),
                     "over_10ms": sum(w > STALL_TARGET_MS for w in waits),
                     "dispatched_later": len(slots), "slot_wait_ms": summary(slots, 3),
                     # the client's: from its headers to the end of its body
                     "headers_to_body_ms": summary([1000 * (r[0] - r[5]) for r in mine], 3)}
    return out


def window_waits(waits: Waits, windows: Sequence[Interval], phase: Interval) -> dict[str, Any]:
    """Daemon stalls (ms) of the windows, against baseline windows of the same lengths."""
    mine = [1000 * waits.longest_in(a, b) for a, b in windows]
    base = [1000 * waits.longest_in(a, b)
            for a, b in random_windows(phase, [b - a for a, b in windows])]
    return {"stall_ms": summary(mine), "baseline_stall_ms": summary(base),
            "over_10ms": sum(s > STALL_TARGET_MS for s in mine),
            "baseline_over_10ms_share": round(
                sum(s > STALL_TARGET_MS for s in base) / max(1, len(base)), 3)}


def lags(records: Sequence[dict[str, Any]]) -> Waits:
    return Waits([(r["end"] - r["lag"], r["end"]) for r in records])


def lag_summary(records: Sequence[dict[str, Any]], phases: dict[str, Interval],
                top: int = 8) -> dict[str, Any]:
    """Loop lags of the probe's threshold or more, per phase, and where the loop was
    during the lags over 10 ms (stack samples, most frequent first), and how many of them
    the loop thread spent on a CPU or waiting for one."""
    out: dict[str, Any] = {}
    for name, (a, b) in phases.items():
        mine = [r for r in records if a <= r["end"] <= b]
        over = [r for r in mine if 1000 * r["lag"] > STALL_TARGET_MS]
        places: Counter[str] = Counter()
        for r in over:
            places.update(r["where"])
        out[name] = {"lag_ms": summary([1000 * r["lag"] for r in mine], 2),
                     "over_10ms": len(over),
                     # the loop thread ran 10 ms or more of it: the daemon's own work
                     "over_10ms_on_cpu": sum(1000 * r.get("cpu", 0) > STALL_TARGET_MS
                                             for r in over),
                     # it waited for a CPU half of it or more: the machine's doing
                     "over_10ms_mostly_waiting_for_cpu": sum(
                         r.get("runq", 0) >= r["lag"] / 2 for r in over),
                     "over_10ms_where": dict(places.most_common(top))}
    return out


def store_waits(awaits: Sequence[dict[str, Any]], waits: Sequence[Interval],
                phases: dict[str, Interval]) -> dict[str, Any]:
    """Token lookups that went to the store, per phase, and how many of the daemon waits
    over 10 ms overlap one (the request's own lookup, or one it queued behind)."""
    lookups = Waits([(r["end"] - r["wall"], r["end"]) for r in awaits])
    out: dict[str, Any] = {}
    for name, (a, b) in phases.items():
        mine = [1000 * r["wall"] for r in awaits if a <= r["end"] <= b]
        long = [(s, e) for s, e in waits if a <= s <= b and 1000 * (e - s) > STALL_TARGET_MS]
        out[name] = {"token_lookup_ms": summary(mine, 2), "daemon_waits_over_10ms": len(long),
                     "of_which_overlap_a_lookup": sum(
                         lookups.longest_in(s, e) > 0 for s, e in long)}
    return out


def daemon_side(run: dict[str, Any], windows: dict[str, list[Interval]]) -> dict[str, Any]:
    """All of the above for one run; `windows` by kind (activate, store, ...)."""
    phases = {"baseline": run["base"], "swap_phase": run["swap_phase"]}
    waits, _ = request_waits(run["intake"])
    searchable, lagged = Waits(waits), lags(run["lags"])
    return {
        "requests": per_request(run["intake"], phases),
        "store_waits": store_waits(run["awaits"], waits, phases),
        "loop_lag": lag_summary(run["lags"], phases),
        "stall_by_window": {kind: window_waits(searchable, w, run["base"])
                            for kind, w in windows.items()},
        "loop_lag_by_window": {kind: window_waits(lagged, w, run["base"])
                               for kind, w in windows.items()},
    }
