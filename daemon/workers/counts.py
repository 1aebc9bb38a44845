"""Token counts from workers, made possible before anyone sees them.

Workers report prompt, cached and output token counts and KV usage; a buggy or hostile
one can send anything the schema allows. Clients and the scheduler must never see a
negative count, more cached tokens than prompt tokens or more output than max_tokens,
so the core passes every count through here. What was impossible is clamped, logged
once per worker and counted in `agentd_worker_bad_counts_total`.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

import msgspec
from prometheus_client.metrics_core import Metric

from daemon.metrics import labelled_counter
from daemon.workers import protocol

log = logging.getLogger("agentd.worker_counts")


def _not_negative(name: str, value: int, problems: list[str]) -> int:
    if value < 0:
        problems.append(f"{name} {value} < 0")
        return 0
    return value


def _at_most(name: str, value: int, bound: int, what: str, problems: list[str]) -> int:
    if value > bound:
        problems.append(f"{name} {value} > {what} {bound}")
        return bound
    return value


def clean_delta(
    msg: protocol.TokenDelta, output_so_far: int, max_tokens: int
) -> tuple[protocol.TokenDelta, list[str]]:
    problems: list[str] = []
    n = _not_negative("num_tokens", msg.num_tokens, problems)
    # An engine stops at max_tokens; a failover's worker is asked only for the rest.
    n = _at_most("num_tokens", n, max(0, max_tokens - output_so_far), "tokens left of max_tokens",
                 problems)
    prompt, cached = msg.prompt_tokens, msg.cached_tokens
    if prompt is not None:
        prompt = _not_negative("prompt_tokens", prompt, problems)
    if cached is not None:
        cached = _not_negative("cached_tokens", cached, problems)
        if prompt is not None:
            cached = _at_most("cached_tokens", cached, prompt, "prompt_tokens", problems)
    if not problems:
        return msg, problems
    return msgspec.structs.replace(msg, num_tokens=n, prompt_tokens=prompt,
                                   cached_tokens=cached), problems


def clean_finish(
    msg: protocol.Finish, tokens_this_dispatch: int | None
) -> tuple[protocol.Finish, list[str]]:
    """The daemon reports the deltas' sum as output; a finish that disagrees is counted."""
    problems: list[str] = []
    prompt = _not_negative("prompt_tokens", msg.prompt_tokens, problems)
    cached = _not_negative("cached_tokens", msg.cached_tokens, problems)
    cached = _at_most("cached_tokens", cached, prompt, "prompt_tokens", problems)
    output = _not_negative("output_tokens", msg.output_tokens, problems)
    if tokens_this_dispatch is not None and output != tokens_this_dispatch:
        problems.append(f"output_tokens {output} != {tokens_this_dispatch} sent as deltas")
        output = tokens_this_dispatch
    ttft = msg.ttft_s
    if ttft is not None and not ttft >= 0:  # also NaN
        problems.append(f"ttft_s {ttft} < 0")
        ttft = None
    if not problems:
        return msg, problems
    return msgspec.structs.replace(msg, prompt_tokens=prompt, cached_tokens=cached,
                                   output_tokens=output, ttft_s=ttft), problems


def clean_stats(stats: protocol.WorkerStats) -> tuple[protocol.WorkerStats, list[str]]:
    problems: list[str] = []
    values = {name: _not_negative(name, getattr(stats, name), problems)
              for name in stats.__struct_fields__}
    values["kv_used_tokens"] = _at_most("kv_used_tokens", values["kv_used_tokens"],
                                        values["kv_capacity_tokens"], "kv_capacity_tokens",
                                        problems)
    if not problems:
        return stats, problems
    return protocol.WorkerStats(**values), problems


def clean_residency(report: dict[str, protocol.ProgramResidency], capacity_tokens: int
                    ) -> tuple[dict[str, protocol.ProgramResidency], list[str]]:
    """The entries that make sense: 0 <= cached <= reachable <= context, and cached within
    the worker's KV; the others are dropped (the daemon falls back to its estimate)."""
    bad = [pid for pid, r in report.items()
           if not 0 <= r.cached_tokens <= r.reachable_tokens <= r.context_tokens
           or r.cached_tokens > capacity_tokens]
    if not bad:
        return report, []
    return ({pid: r for pid, r in report.items() if pid not in bad},
            [f"residency of {len(bad)} programs out of range (e.g. {bad[0][:64]!r})"])


MAX_NODE_CHARS = 255  # a host name's limit; chosen by whoever connected


def register_problem(msg: protocol.Register) -> str | None:
    for name in ("kv_capacity_tokens", "block_size", "max_batch"):
        value = getattr(msg, name)
        if value < 0:
            return f"{name} must be >= 0, got {value}"
    if msg.dp_rank is not None and msg.dp_rank < 0:
        return f"dp_rank must be >= 0, got {msg.dp_rank}"
    if len(msg.node) > MAX_NODE_CHARS:
        return f"node must be at most {MAX_NODE_CHARS} characters"
    return None


# Refused identities are remembered only to log each once; a peer cycling through
# identities must neither grow memory without bound nor flood the log and the store.
_MAX_REMEMBERED = 1024
_MAX_REFUSALS_LOGGED_PER_MIN = 20


@dataclass
class ProtocolTallies:
    """What workers did wrong, for the log (once each) and /metrics (every time)."""

    bad_counts: Counter[str] = field(default_factory=Counter)  # by worker
    stalls: Counter[str] = field(default_factory=Counter)  # requests moved, by worker
    refused: Counter[str] = field(default_factory=Counter)  # registrations, by reason
    _logged: set[str] = field(default_factory=set)
    _refused_seen: set[bytes] = field(default_factory=set)
    _refusal_window: tuple[float, int] = (0.0, 0)  # (minute started, refusals logged in it)

    def bad(self, worker_id: str, what: str, problems: list[str]) -> bool:
        """Count impossible values; True (and a log line) the first time for this worker."""
        self.bad_counts[worker_id] += 1
        if worker_id in self._logged:
            return False
        self._logged.add(worker_id)
        log.warning("worker %s sent impossible token counts in a %s (%s); clamped them. "
                    "Further ones are only counted (agentd_worker_bad_counts_total)",
                    worker_id, what, "; ".join(problems))
        return True

    def refuse(self, identity: bytes, reason: str, now: float) -> bool:
        """Count a refused registration; True when it should be logged: the first time
        for this socket identity, and no more than a few times a minute in all."""
        self.refused[reason] += 1
        if identity in self._refused_seen:
            return False
        if len(self._refused_seen) >= _MAX_REMEMBERED:
            self._refused_seen.clear()
        self._refused_seen.add(identity)
        started, logged = self._refusal_window
        if now - started >= 60.0:
            started, logged = now, 0
        self._refusal_window = (started, logged + 1)
        return logged < _MAX_REFUSALS_LOGGED_PER_MIN

    def families(self) -> Iterator[Metric]:
        yield labelled_counter(
            "agentd_worker_bad_counts_total",
            "Worker messages with impossible token counts (clamped)",
            ["worker"], [([w], n) for w, n in sorted(self.bad_counts.items())])
        yield labelled_counter(
            "agentd_request_stalls_total",
            "Requests moved off a live worker that made no progress on them",
            ["worker"], [([w], n) for w, n in sorted(self.stalls.items())])
        yield labelled_counter(
            "agentd_worker_registrations_refused_total", "Worker registrations refused, by reason",
            ["reason"], [([reason], n) for reason, n in sorted(self.refused.items())])
