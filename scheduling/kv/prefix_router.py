"""A cache-aware prefix router as a KV policy: the longest cached prefix, balanced by load.

Sources: SGLang's cache-aware router (sgl-router, "cache_aware" policy: while the workers'
loads are balanced a request goes to the worker whose radix tree matches the longest part
of its prompt if the match rate passes `cache_threshold`, else to the worker with the
least cached; once the loads differ by more than `balance_abs_threshold` and by a factor
over `balance_rel_threshold` it routes to the least loaded); vLLM's production-stack
prefix-aware routing and llm-d's inference scheduler (a prefix-cache scorer weighed
against load scorers). Like those routers it knows no more than what it has routed and
what the engines report: here the daemon's residency view.
"""

from __future__ import annotations

from dataclasses import dataclass

from scheduling.kv.baselines import bind
from scheduling.kv.decisions import Decision
from scheduling.kv.policy import KvPolicy
from scheduling.kv.view import RESIDENT, KvView, ProgramView, WorkerView


@dataclass(frozen=True)
class PrefixRouterOptions:
    """`cache_threshold`: the share of the context that must be cached on a worker for the
    router to follow the cache (SGLang's default 0.5). The load is a worker's used KV share;
    the workers are imbalanced when the most and the least loaded differ by more than
    `balance_abs` of capacity and the most loaded carries over `balance_rel` times the least
    (SGLang counts requests, 64 and 1.5; used KV is what this layer sees)."""

    cache_threshold: float = 0.5
    balance_abs: float = 0.1
    balance_rel: float = 1.5


def cached_tokens(view: KvView, program: ProgramView, worker_id: str) -> int:
    """Tokens of the program's context the daemon believes are cached on `worker_id`.

    On the worker it runs or last ran on: as many as the engine's cache events say are
    cached there (`kv_cached_tokens`, the longest-prefix match a radix tree would give),
    else its whole context unless the residency view says its blocks were evicted
    (unknown counts as cached: a router remembers what it routed and learns of evictions
    only when told). Elsewhere: its group's shared prefix when another program of the
    group is resident there (or paused there, not known evicted)."""
    if program.worker_id == worker_id and program.kv_cached_tokens is not None:
        return min(program.kv_cached_tokens, program.context_tokens)
    if program.worker_id == worker_id and program.kv_resident is not False:
        return program.context_tokens
    if program.prefix_group is None or program.prefix_tokens <= 0:
        return 0
    for other in view.programs:
        if (other.program_id != program.program_id and other.worker_id == worker_id
                and other.prefix_group == program.prefix_group
                and (other.status in RESIDENT or other.kv_resident is not False)):
            return min(program.prefix_tokens, program.context_tokens)
    return 0


class PrefixRouterPolicy(KvPolicy):
    """Cache-aware routing with load balance (SGLang's cache-aware router, vLLM
    production-stack and llm-d prefix-aware routing), no pausing: every waiting program is
    admitted at once and the engine's own eviction and preemption decide, as with
    `vllm-default`; only the choice of worker differs."""

    name = "prefix-router"

    def __init__(self, options: PrefixRouterOptions | None = None) -> None:
        self.options = options or PrefixRouterOptions()

    def decide(self, view: KvView, now: float) -> list[Decision]:
        sent: dict[str, int] = {}
        decisions: list[Decision] = []
        for program in sorted(view.programs, key=lambda p: (p.waited_from, p.program_id)):
            if not program.waiting:
                continue
            worker_id = self.choose(view, program, sent)
            if worker_id is None:
                break
            sent[worker_id] = sent.get(worker_id, 0) + program.context_tokens
            decisions.append(bind(program, worker_id, "prefix-route"))
        return decisions

    def route(self, view: KvView, program_id: str, now: float) -> str | None:
        return self.choose(view, view.program(program_id))

    def choose(self, view: KvView, program: ProgramView,
               sent: dict[str, int] | None = None) -> str | None:
        """The worker for the program's next request; `sent`: tokens already placed on
        each worker in this step."""
        workers = view.healthy_workers()
        if not workers:
            return None
        sent = sent or {}

        def load(worker: WorkerView) -> float:
            return (worker.used_tokens + sent.get(worker.worker_id, 0)) / max(
                worker.capacity_tokens, 1)

        least = min(workers, key=lambda w: (load(w), w.worker_id))
        most = max(workers, key=lambda w: (load(w), w.worker_id))
        if (load(most) - load(least) > self.options.balance_abs
                and load(most) > self.options.balance_rel * load(least)):
            return least.worker_id
        best = max(workers, key=lambda w: (cached_tokens(view, program, w.worker_id),
                                           -load(w), w.worker_id))
        match = cached_tokens(view, program, best.worker_id)
        if match > self.options.cache_threshold * max(program.context_tokens, 1):
            return best.worker_id
        return least.worker_id
