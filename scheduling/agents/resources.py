"""Logical resource reservations, the way Ray treats an actor's resources.

Each provisioned instance (serving or starting) of an agent reserves its type's
declared `resources` ({"CPU", "GPU", "memory_mb"}) out of its pool's capacity (a pool is
one run's sandbox); a provision that does not fit beside what the pool's instances
already reserve is refused, and a kill gives the reservation back. This is accounting,
not isolation: nothing here bounds what an instance actually uses.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import NamedTuple

KEYS = ("CPU", "GPU", "memory_mb")
Resources = Mapping[str, float]
_EPS = 1e-9  # fractional GPUs (0.1 + 0.2) must still fit a capacity of 0.3


class NoCapacity(ValueError):
    """A reservation that does not fit; the message says which resource and by how much."""


def total(reservations: Iterable[Resources]) -> dict[str, float]:
    out: dict[str, float] = {}
    for r in reservations:
        for k, v in r.items():
            out[k] = out.get(k, 0.0) + v
    return out


def plus(a: Resources, b: Resources, sign: float = 1.0) -> dict[str, float]:
    out = dict(a)
    for k, v in b.items():
        out[k] = out.get(k, 0.0) + sign * v
    return out


class Short(NamedTuple):
    """The first resource one more instance lacks: how much it needs of `key`, how much
    is free, and the pool's capacity and reservations of it."""

    key: str
    need: float
    free: float
    have: float
    used: float


def short_of(need: Resources, reserved: Resources, capacity: Resources) -> Short | None:
    """What one more reservation of `need` lacks (None: it fits). A resource the
    capacity does not name has none (a run has no GPU unless it is given some)."""
    for key, n in need.items():
        if n <= 0:
            continue
        have, used = capacity.get(key, 0.0), reserved.get(key, 0.0)
        if used + n > have + _EPS:
            return Short(key, n, max(0.0, have - used), have, used)
    return None


def describe(agent_type: str, s: Short) -> str:
    return (f"{agent_type} reserves {s.key}={s.need:g} per instance; {s.free:g} of the "
            f"run's {s.key}={s.have:g} is free ({s.used:g} reserved by its live instances)")


def shortfall(agent_type: str, need: Resources, reserved: Resources,
              capacity: Resources) -> str | None:
    """Why one more instance of `agent_type` does not fit (None: it fits)."""
    s = short_of(need, reserved, capacity)
    return None if s is None else describe(agent_type, s)


def never_fits(agent_type: str, need: Resources, capacity: Resources) -> str | None:
    """Why even a single instance of `agent_type` cannot fit an empty pool."""
    for key, n in need.items():
        if n > capacity.get(key, 0.0) + _EPS:
            return (f"agent {agent_type} reserves {key}={n:g} per instance, more than the "
                    f"run has in all ({key}={capacity.get(key, 0.0):g}, from its sandbox "
                    f"limits); declare less or give the run more")
    return None
