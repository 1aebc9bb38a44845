"""Which programs have been idle too long: the clock behind `program_idle_timeout_s`.

A program that nobody releases (a crashed client, a framework that never calls release)
would stay ACTING for ever, holding its KV claim and its place in the scheduler's view.
The daemon touches a program here on each sign of life (a request queued or ended, a
tool call ended) and asks `due(now)` on its periodic tick for the ones whose quiet time
reached their timeout; whether one is really idle (no request queued or running, no tool
running) is the daemon's to check, as only it knows.

Cost: one ordered map per distinct timeout (the default, each tenant override, the
lineage timeout), oldest touch first, so `touch` and `forget` are O(1) and `due` looks
only at the entries it returns plus one per map. Touches come in clock order; one given
an earlier time than the newest in its map is still put last, so it can be found late,
never early.

Timeouts come from the config: `program_idle_timeout_s` (0: programs never expire) and
per tenant `[slo.tenants.NAME] program_idle_timeout_s` (`tenant_timeouts` reads them).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

TIMEOUT_KEY = "program_idle_timeout_s"


@dataclass(frozen=True, slots=True)
class Quiet:
    """A program's last sign of life, and how long it may stay quiet (`setting` names the
    config key that says so, for the trace)."""

    program_id: str
    tenant: str
    since: float
    timeout_s: float
    setting: str = TIMEOUT_KEY

    def idle_s(self, now: float) -> float:
        return max(now - self.since, 0.0)


class IdleClock:
    """The quiet programs, by timeout and then by last touch (module docstring)."""

    def __init__(self) -> None:
        self._maps: dict[float, OrderedDict[str, Quiet]] = {}
        self._timeout_of: dict[str, float] = {}

    def __len__(self) -> int:
        return len(self._timeout_of)

    def __contains__(self, program_id: object) -> bool:
        return program_id in self._timeout_of

    def get(self, program_id: str) -> Quiet | None:
        timeout = self._timeout_of.get(program_id)
        return None if timeout is None else self._maps[timeout].get(program_id)

    def touch(self, quiet: Quiet) -> None:
        """The program showed life at `quiet.since`; a timeout <= 0 stops tracking it."""
        self.forget(quiet.program_id)
        if quiet.timeout_s <= 0:
            return
        self._maps.setdefault(quiet.timeout_s, OrderedDict())[quiet.program_id] = quiet
        self._timeout_of[quiet.program_id] = quiet.timeout_s

    def forget(self, program_id: str) -> Quiet | None:
        timeout = self._timeout_of.pop(program_id, None)
        if timeout is None:
            return None
        entries = self._maps[timeout]
        quiet = entries.pop(program_id)
        if not entries:
            del self._maps[timeout]
        return quiet

    def due(self, now: float) -> list[Quiet]:
        """Take out every program quiet for at least its timeout at `now`, oldest first
        within each timeout."""
        out: list[Quiet] = []
        for timeout in list(self._maps):
            entries = self._maps[timeout]
            while entries:
                quiet = next(iter(entries.values()))
                if quiet.since + timeout > now:
                    break
                self.forget(quiet.program_id)
                out.append(quiet)
        return out

    def quiet_for(self, now: float, at_least_s: float,
                  tenant: str | None = None) -> list[Quiet]:
        """Every tracked program quiet for at least `at_least_s` (of `tenant` only, if
        given), longest quiet first: a full scan, for an operator's bulk release."""
        found = [q for entries in self._maps.values() for q in entries.values()
                 if q.idle_s(now) >= at_least_s and (tenant is None or q.tenant == tenant)]
        return sorted(found, key=lambda q: q.since)


def tenant_timeouts(tenants: Any) -> dict[str, float]:
    """`program_idle_timeout_s` of each `[slo.tenants.NAME]` table that sets it; a
    ValueError naming the key for a value that is not a number >= 0."""
    out: dict[str, float] = {}
    if not isinstance(tenants, Mapping):
        return out  # the [slo] table's own parsing names that error
    for name, table in tenants.items():
        if not isinstance(table, Mapping) or TIMEOUT_KEY not in table:
            continue
        out[str(name)] = timeout_value(f"slo.tenants.{name}.{TIMEOUT_KEY}", table[TIMEOUT_KEY])
    return out


def timeout_value(key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
        raise ValueError(f"config key '{key}' must be a number of seconds >= 0 "
                         f"(0: programs never expire), got {value!r}")
    return float(value)
