"""Estimates whether a paused program's KV blocks are still in a worker's prefix cache.

The daemon cannot see an engine's block cache, only the token counts each request
reports (prompt, output) and the worker's KV usage. The estimate follows the LRU
turnover of vLLM's free-block queue (the sim engine models the same queue):

- a finished request's blocks go to the tail of the free queue (its last block
  first, so a context loses its end before its start), and a new block is taken
  from the head; a cache hit on a free block takes that block out of the queue;
- so when a program's request ends, the blocks ahead of its last block are the
  worker's free blocks at that moment (`room_ahead`), and its last block is evicted
  once more than that have been taken out of the queue since;
- blocks taken out since = the growth of the worker's used KV plus the blocks freed
  since (used = taken - freed), so live usage counts a running request's prefill as
  soon as the engine reports it, not when the request ends;
- less the cache hits on blocks behind the program: a program's next request mostly
  hits its own previous context, and when that was freed after the program, taking
  it out of the queue does not move the program up. A hit is placed by where the
  hitting program's own last request left its blocks, and counted as soon as the
  engine reports the request's cached tokens (used KV grows by them at once).

Freed blocks are counted from the ended requests' reported prompt + output tokens and
hits from their cached tokens. The estimate is pessimistic where that overcounts:
blocks a request shared with a request still running are not freed; a hit on another
program's blocks (a shared prefix) behind the program is not recognised. It is
optimistic where turnover goes unreported: a preempted request frees and reallocates
its blocks in between. With usage from periodic stats, a request that ended since the
last report is counted as freed while still counted as used: pessimistic for that
while.

Pure and clock-free: positions are in tokens taken from the queue, not in time.
"""

from __future__ import annotations

from collections.abc import Container
from dataclasses import dataclass


@dataclass
class _Mark:
    worker_id: str
    used: int  # the worker's used KV once the program's last request freed its blocks
    freed: int  # the worker's freed-tokens counter then: its place in the free queue
    room_ahead: int  # free tokens ahead of its last block in the LRU then
    behind: int = 0  # cache hits since on blocks freed after it


class ResidencyEstimator:
    def __init__(self) -> None:
        self._freed: dict[str, int] = {}
        self._marks: dict[str, _Mark] = {}
        self._hits: dict[str, int] = {}  # cached tokens counted of each running request

    def request_hit(self, program_id: str, worker_id: str, cached_tokens: int) -> None:
        """The program's running request on `worker_id` found `cached_tokens` cached
        (may be called again for the same request; only growth is counted)."""
        counted = self._hits.get(program_id, 0)
        if cached_tokens <= counted:
            return
        self._hits[program_id] = cached_tokens
        last = self._marks.get(program_id)
        if last is not None and last.worker_id == worker_id:
            self._hit_behind(worker_id, last.freed, cached_tokens - counted)

    def request_ended(
        self, program_id: str | None, worker_id: str, prompt_tokens: int, cached_tokens: int,
        output_tokens: int, used_tokens: int, capacity_tokens: int, block_size: int = 1,
    ) -> None:
        """A request ended on `worker_id` (whatever its outcome, its blocks were freed).
        `used_tokens` is the worker's used KV not counting this request's blocks;
        `program_id` None for a request of no program."""
        if program_id is not None:
            self.request_hit(program_id, worker_id, min(cached_tokens, prompt_tokens))
            self._hits.pop(program_id, None)
        own = held_tokens(prompt_tokens, output_tokens, block_size)
        freed = self._freed.get(worker_id, 0) + own
        self._freed[worker_id] = freed
        if program_id is not None:
            room = max(0, capacity_tokens - max(0, used_tokens) - own)
            self._marks[program_id] = _Mark(worker_id, max(0, used_tokens), freed, room)

    def _hit_behind(self, worker_id: str, place: int, tokens: int) -> None:
        """`tokens` of blocks freed at `place` in the queue were hit: behind every
        program freed before them."""
        for mark in self._marks.values():
            if mark.worker_id == worker_id and mark.freed < place:
                mark.behind += tokens

    def taken_since(self, program_id: str, used_tokens: int) -> int | None:
        """Tokens of blocks taken out of the worker's free queue since the program's
        last request ended there, given the worker's used KV now."""
        mark = self._marks.get(program_id)
        if mark is None:
            return None
        freed = self._freed.get(mark.worker_id, 0) - mark.freed
        return max(0, used_tokens - mark.used + freed - mark.behind)

    def resident(self, program_id: str, worker_id: str | None,
                 used_tokens: int | None) -> bool | None:
        """Are the program's blocks still cached on `worker_id`, whose used KV is now
        `used_tokens`? None when no request of it ended since it was last forgotten,
        or the worker's usage is unknown."""
        mark = self._marks.get(program_id)
        if mark is None or worker_id is None:
            return None
        if mark.worker_id != worker_id:
            return False  # its blocks are on another worker
        taken = self.taken_since(program_id, used_tokens) if used_tokens is not None else None
        return None if taken is None else taken <= mark.room_ahead

    def worker_reset(self, worker_id: str) -> None:
        """The worker's cache is gone (it restarted): every program last on it is cold."""
        for mark in self._marks.values():
            if mark.worker_id == worker_id:
                mark.room_ahead = -1  # nothing of it is left, even with nothing taken

    def forget(self, program_id: str) -> None:
        self._marks.pop(program_id, None)
        self._hits.pop(program_id, None)

    def forget_except(self, program_ids: Container[str]) -> None:
        """Drop the marks of programs not in `program_ids`."""
        for pid in [p for p in {**self._marks, **self._hits} if p not in program_ids]:
            self.forget(pid)



def held_tokens(prompt_tokens: int, output_tokens: int, block_size: int) -> int:
    """Tokens of the blocks a request held: its whole context, in full blocks."""
    bs = max(1, block_size)
    return -(-(max(0, prompt_tokens) + max(0, output_tokens)) // bs) * bs
