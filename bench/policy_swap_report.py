"""Numbers and figure of the swap benchmark: latency percentiles and dispatch gaps.

A dispatch gap is the time between two consecutive dispatches (any request, any worker)
by the daemon's own clock. A window's stall is the longest gap that overlaps it: a
window [start, end] during which the daemon sent nothing has a stall of at least
end - start. Baseline windows have the same lengths as the swap windows and are laid at
random over the phase without swaps, so the two distributions compare like with like.
The `_no_gc` figures keep only windows whose longest gap held no garbage-collection
pause of the daemon or a worker (bench/daemon_probe), to tell the two causes apart.
"""

from __future__ import annotations

import random
from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from itertools import pairwise
from pathlib import Path
from typing import Any

BASELINE_DRAWS = 20  # baseline windows per swap window
STALL_TARGET_MS = 10.0


def pct(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile; 0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, round(q / 100 * len(ordered) + 0.5) - 1))
    return ordered[rank]


def summary(values: Sequence[float], digits: int = 2) -> dict[str, float]:
    return {"n": len(values), "p50": round(pct(values, 50), digits),
            "p99": round(pct(values, 99), digits), "max": round(max(values, default=0.0), digits)}


def longest_gap_at(dispatches: Sequence[float], start: float,
                   end: float) -> tuple[float, float]:
    """The longest gap between consecutive dispatches that overlaps [start, end]."""
    if len(dispatches) < 2:
        return (start, end)
    first = max(0, bisect_right(dispatches, start) - 1)
    last = min(len(dispatches) - 1, bisect_left(dispatches, end))
    span = dispatches[first:last + 1]
    return max(pairwise(span), key=lambda g: g[1] - g[0], default=(start, start))


def longest_gap(dispatches: Sequence[float], start: float, end: float) -> float:
    a, b = longest_gap_at(dispatches, start, end)
    return b - a


def gaps_between(dispatches: Sequence[float], start: float, end: float) -> list[float]:
    inside = [t for t in dispatches if start <= t <= end]
    return [b - a for a, b in pairwise(inside)]


def random_windows(phase: tuple[float, float], lengths: Sequence[float],
                   seed: int = 7) -> list[tuple[float, float]]:
    """BASELINE_DRAWS windows of each length at random places in `phase`."""
    rng = random.Random(seed)
    out = []
    for length in lengths:
        for _ in range(BASELINE_DRAWS):
            start = rng.uniform(phase[0], max(phase[0], phase[1] - length))
            out.append((start, start + length))
    return out


def baseline_stalls(dispatches: Sequence[float], phase: tuple[float, float],
                    lengths: Sequence[float]) -> list[float]:
    """Longest gaps in windows of the given lengths at random places in `phase`."""
    return [longest_gap(dispatches, a, b) for a, b in random_windows(phase, lengths)]


def _collected(gap: tuple[float, float], pauses: Sequence[tuple[float, float]]) -> bool:
    return any(a < gap[1] and b > gap[0] for a, b in pauses)


def _stalls(dispatches: Sequence[float], windows: Sequence[tuple[float, float]],
            pauses: Sequence[tuple[float, float]]) -> tuple[list[float], list[float]]:
    """Stalls (ms) of all windows, and of those whose longest gap held no collection."""
    gaps = [longest_gap_at(dispatches, a, b) for a, b in windows]
    every = [1000 * (b - a) for a, b in gaps]
    clean = [1000 * (b - a) for a, b in gaps if not _collected((a, b), pauses)]
    return every, clean


def window_stats(dispatches: Sequence[float], windows: Sequence[tuple[float, float]],
                 phase: tuple[float, float],
                 pauses: Sequence[tuple[float, float]] = ()) -> dict[str, Any]:
    """Stalls (ms) of the windows against baseline windows of the same lengths; `pauses`
    are garbage collections (start, end) in the daemon or a worker."""
    stalls, clean = _stalls(dispatches, windows, pauses)
    base, base_clean = _stalls(
        dispatches, random_windows(phase, [b - a for a, b in windows]), pauses)
    over = sum(s > STALL_TARGET_MS for s in stalls)
    return {
        "window_ms": summary([1000 * (b - a) for a, b in windows]),
        "stall_ms": summary(stalls), "baseline_stall_ms": summary(base),
        "stall_ms_no_gc": summary(clean), "baseline_stall_ms_no_gc": summary(base_clean),
        "over_10ms": over, "over_10ms_no_gc": sum(s > STALL_TARGET_MS for s in clean),
        "baseline_over_10ms_share": round(
            sum(s > STALL_TARGET_MS for s in base) / max(1, len(base)), 3),
    }


def _bars(ax: Any, layers: dict[str, Any], series: list[tuple[str, str, str]],
          top: str) -> None:
    """p50 bars with a whisker up to `top` ("p99" or "max") for each (label, key, sub)."""
    names = list(layers)
    width = 0.8 / len(series)
    for i, (label, key, sub) in enumerate(series):
        xs = [x - 0.4 + width * (i + 0.5) for x in range(len(names))]
        mid = [layers[n][key][sub]["p50"] if sub else layers[n][key]["p50"] for n in names]
        high = [layers[n][key][sub][top] if sub else layers[n][key][top] for n in names]
        ax.bar(xs, mid, width, label=f"{label} p50")
        ax.errorbar(xs, mid, yerr=[[0] * len(mid), [h - m for h, m in zip(high, mid, strict=True)]],
                    fmt="none", ecolor="black", capsize=3)
    ax.set_xticks(list(range(len(names))), names)
    ax.legend(fontsize=7)


def plot(layers: dict[str, Any], raw: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b, c) = plt.subplots(1, 3, figsize=(16, 4.2))
    _bars(a, layers, [("activate", "activate_ms", ""), ("store", "store_ms", ""),
                      ("rollback", "rollback_ms", "")], "p99")
    a.set(title="latency (activate: until read back); whisker p99", ylabel="ms")
    _bars(b, layers, [(call, f"loop_hold_{call}", "cpu_less_gc_ms")
                      for call in ("store", "activate", "rollback")], "max")
    b.axhline(STALL_TARGET_MS, color="red", linestyle="--", label="10 ms target")
    b.legend(fontsize=7)
    b.set(title="longest loop hold per call (CPU less GC); whisker max", ylabel="ms")
    for label, values in raw.items():
        ordered = sorted(values)
        c.step(ordered, [(i + 1) / len(ordered) for i in range(len(ordered))], where="post",
               label=label)
    c.axvline(STALL_TARGET_MS, color="red", linestyle="--", label="10 ms target")
    c.set(title="longest dispatch gap in a window", xlabel="ms", ylabel="CDF", xscale="log")
    c.legend(fontsize=7)
    fig.suptitle("policy hot swap under gateway load (2 sim workers, shared 2-core machine)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
