"""Finds running requests that a live worker makes no progress on.

A worker that heartbeats but never answers (a wedged engine, a bug, a hostile peer)
would hold its requests forever: the heartbeat check only catches silent workers. A
request is stalled when no token delta arrived since its dispatch or its last delta for
`stall_s` *and* the worker's engine did not step in that time either (its heartbeat's
`steps` counter stood still): an engine that steps is busy, not stuck, so a long
prefill or a long wait inside a busy engine is left alone. An engine that steps but
never serves one request is caught by `limit_s`, a bound on the wait for any token.

Pure bookkeeping with the clock passed in; the core applies what it finds.
"""

from __future__ import annotations

from dataclasses import dataclass

# A worker found stalling is suspect (no new requests) for stall_s, doubling with each
# repeat, up to this long; a restarted worker process registers afresh and is healthy.
MAX_SUSPECT_S = 600.0


@dataclass
class _Running:
    worker_id: str
    since: float  # dispatch or the latest delta
    output_at_dispatch: int


@dataclass(frozen=True)
class Stall:
    request_id: str
    reason: str


class ProgressWatch:
    def __init__(self, stall_s: float, limit_s: float) -> None:
        self.stall_s = stall_s  # 0 = off
        self.limit_s = limit_s  # 0 = off
        self._running: dict[str, _Running] = {}
        self._stepped: dict[str, tuple[int, float]] = {}  # worker -> (steps, changed at)
        self._strikes: dict[str, int] = {}
        self._suspect_until: dict[str, float] = {}

    # --- requests -----------------------------------------------------------------------

    def dispatched(self, request_id: str, worker_id: str, now: float, output_tokens: int) -> None:
        self._running[request_id] = _Running(worker_id, now, output_tokens)

    def progressed(self, request_id: str, now: float) -> None:
        running = self._running.get(request_id)
        if running is not None:
            running.since = now

    def forget(self, request_id: str) -> None:
        self._running.pop(request_id, None)

    def tokens_this_dispatch(self, request_id: str, output_tokens: int) -> int | None:
        """Tokens the deltas of the current dispatch carried (a failover starts anew)."""
        running = self._running.get(request_id)
        return None if running is None else output_tokens - running.output_at_dispatch

    # --- workers ------------------------------------------------------------------------

    def registered(self, worker_id: str, now: float) -> None:
        self._stepped[worker_id] = (-1, now)
        self._suspect_until.pop(worker_id, None)

    def engine_steps(self, worker_id: str, steps: int, now: float) -> None:
        last = self._stepped.get(worker_id)
        if last is None or last[0] != steps:
            self._stepped[worker_id] = (steps, now)

    def stalled(self, now: float) -> dict[str, list[Stall]]:
        """Stalled requests by worker."""
        out: dict[str, list[Stall]] = {}
        for request_id, r in self._running.items():
            reason = self._stall_reason(r, now)
            if reason is not None:
                out.setdefault(r.worker_id, []).append(Stall(request_id, reason))
        return out

    def _stall_reason(self, r: _Running, now: float) -> str | None:
        quiet = now - r.since
        stepped_at = self._stepped.get(r.worker_id, (-1, r.since))[1]
        idle = now - max(r.since, stepped_at)
        if self.stall_s and idle > self.stall_s:
            return f"no tokens for {quiet:.1f}s and no engine step for {idle:.1f}s"
        if self.limit_s and quiet > self.limit_s:
            return f"no tokens for {quiet:.1f}s (the engine steps, but not for this request)"
        return None

    def suspect(self, worker_id: str, now: float) -> float:
        """Mark a stall on the worker; returns until when it gets no new requests."""
        strikes = self._strikes.get(worker_id, 0) + 1
        self._strikes[worker_id] = strikes
        base = self.stall_s or self.limit_s
        until = now + min(base * 2.0 ** min(strikes - 1, 16), MAX_SUSPECT_S)
        self._suspect_until[worker_id] = until
        return until

    def probation_over(self, worker_id: str, now: float) -> bool:
        until = self._suspect_until.get(worker_id)
        if until is None or now < until:
            return False
        del self._suspect_until[worker_id]
        return True
