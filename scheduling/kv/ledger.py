"""Projected KV demand per worker while one decision step is being planned."""

from __future__ import annotations

import math
from collections.abc import Callable

from scheduling.kv.view import KvView, ProgramStatus, ProgramView

Weight = Callable[[ProgramView], float]
_GroupKey = tuple[str, str]


def decay(elapsed_s: float, decay_lambda: float) -> float:
    """f(t) = exp(-λt): f(0) = 1, f(∞) = 0.

    The paper shows exponential decay is the only time-homogeneous choice when tool
    latency is memoryless, i.e. when elapsed tool time says nothing about what is left.
    """
    return math.exp(-decay_lambda * max(0.0, elapsed_s))


class Ledger:
    """Token demand per worker, updated as a step plans pauses and placements.

    Invariant: `demand(w)` is the weighted tokens of every program booked on `w`,
    plus, when prefixes are shared, each booked prefix group's prefix once.
    Unhealthy workers get capacity 0, so everything on them looks over the limit.
    Programs marked to pause after their request are not booked: the plan already
    counts them gone. Their tokens are kept apart as `leaving(w)` until the request
    ends, because until then the engine still holds them: `room_now` is the room
    a placement can use without overcommitting the worker.
    """

    def __init__(self, view: KvView, weight: Weight, share_prefix: bool = False) -> None:
        self._capacity = {
            w.worker_id: (w.capacity_tokens if w.healthy else 0) for w in view.workers
        }
        self._members = dict.fromkeys(self._capacity, 0.0)
        self._share_prefix = share_prefix
        self._groups: dict[_GroupKey, int] = {}
        self._prefix: dict[_GroupKey, int] = {}
        self._booked: dict[str, tuple[str, float, _GroupKey | None]] = {}
        self._leaving = dict.fromkeys(self._capacity, 0.0)
        # Every live program, every plan: `book` inlined for a program outside any prefix
        # group (the same sums in the same order), and the status compared by identity
        # (an Enum's hash is a Python call).
        reasoning, acting = ProgramStatus.REASONING, ProgramStatus.ACTING
        members, booked, capacity = self._members, self._booked, self._capacity
        for p in view.programs:
            status, worker_id = p.status, p.worker_id
            if (status is not reasoning and status is not acting) or worker_id not in capacity:
                continue
            if p.pause_marked:
                if status is reasoning:
                    self._leaving[worker_id] += p.context_tokens
            elif share_prefix and p.prefix_group is not None and p.prefix_tokens > 0:
                self.book(worker_id, p, weight(p))
            else:
                amount = weight(p) * p.context_tokens
                members[worker_id] += amount
                booked[p.program_id] = (worker_id, amount, None)

    def worker_ids(self) -> list[str]:
        return sorted(self._capacity)

    def demand(self, worker_id: str) -> float:
        if not self._prefix:  # no prefix group booked (most plans): no generator to run
            return self._members[worker_id]
        shared = sum(
            tokens
            for key, tokens in self._prefix.items()
            if key[0] == worker_id and self._groups.get(key, 0) > 0
        )
        return self._members[worker_id] + shared

    def limit(self, worker_id: str, watermark: float) -> float:
        return self._capacity[worker_id] * watermark

    def room(self, worker_id: str, watermark: float) -> float:
        return self.limit(worker_id, watermark) - self.demand(worker_id)

    def room_now(self, worker_id: str, watermark: float) -> float:
        """`room` less the tokens of marked programs whose request still runs."""
        return self.room(worker_id, watermark) - self._leaving[worker_id]

    def is_healthy(self, worker_id: str) -> bool:
        return self._capacity.get(worker_id, 0) > 0

    def cached_prefix(self, worker_id: str, program: ProgramView) -> int:
        """Tokens of `program` already held on `worker_id` through its prefix group."""
        key = self._group_key(worker_id, program)
        return program.prefix_tokens if key and self._groups.get(key, 0) > 0 else 0

    def cost(self, worker_id: str, program: ProgramView, weight: float = 1.0) -> float:
        """How much `demand(worker_id)` grows if `program` is booked there."""
        key = self._group_key(worker_id, program)
        if key is None:
            return weight * program.context_tokens
        own = weight * (program.context_tokens - program.prefix_tokens)
        return own + program.prefix_tokens - self.cached_prefix(worker_id, program)

    def book(self, worker_id: str, program: ProgramView, weight: float = 1.0) -> None:
        key = self._group_key(worker_id, program)
        own = program.context_tokens - (program.prefix_tokens if key else 0)
        self._members[worker_id] += weight * own
        if key:
            self._groups[key] = self._groups.get(key, 0) + 1
            self._prefix[key] = max(self._prefix.get(key, 0), program.prefix_tokens)
        self._booked[program.program_id] = (worker_id, weight * own, key)

    def booked(self, program_id: str) -> float:
        entry = self._booked.get(program_id)
        return 0.0 if entry is None else entry[1]

    def unbook(self, program_id: str, leaving: bool = False) -> None:
        """Drop a program's demand; `leaving`: it keeps its KV until its request ends."""
        worker_id, amount, key = self._booked.pop(program_id)
        self._members[worker_id] -= amount
        if leaving:
            self._leaving[worker_id] += amount
        if key:
            self._groups[key] -= 1

    def _group_key(self, worker_id: str, program: ProgramView) -> _GroupKey | None:
        if not self._share_prefix or program.prefix_group is None:
            return None
        if program.prefix_tokens <= 0:
            return None
        return (worker_id, program.prefix_group)
