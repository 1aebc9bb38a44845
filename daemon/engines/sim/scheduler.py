"""Pure step logic of the simulated engine: a model of vLLM v1's scheduler.

One ``step()`` is one engine iteration, in vLLM v1's order:

1. Running requests, oldest first, each get the tokens they still need (1 for a decode, the
   rest of the prompt for a prefill), capped by the step's remaining token budget, so a long
   prompt is prefilled in chunks over several steps (chunked prefill). If the KV blocks for a
   request cannot be allocated, the newest running request is preempted (its blocks freed, its
   computed tokens forgotten, put back at the front of the waiting queue) and the allocation is
   retried; if the request itself was the newest, it is the one preempted. Preemption happens
   only then: when a block is needed and none is free.
2. Only if nothing was preempted this step, waiting requests are admitted in FCFS order while
   there is budget and fewer than ``max_num_seqs`` are running: each looks up its longest
   resident prefix (those tokens count as cached), then allocates blocks for the rest of its
   chunk; the first one that does not fit stops admission (head-of-line, as in vLLM).
3. The modelled forward pass: every request whose known tokens are now all computed samples one
   token. Requests that reach ``max_tokens``, their simulated EOS or ``max_model_len`` finish and
   free their blocks.

The step's duration comes from the ``CostModel``; nothing here reads a clock or sleeps, so the
same scheduler runs under the wall-clock ``SimEngine`` and the virtual-time driver. Per-step work
is O(scheduled requests + blocks allocated), independent of the queue length, except ``abort`` of
a waiting request (O(waiting)).

Left out, on purpose: priority scheduling (FCFS only), ``long_prefill_token_threshold``,
speculative decoding, encoder inputs, stop strings.
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass, field

from daemon.engines.kv_events import Residency
from daemon.engines.sim.blocks import KVCacheManager
from daemon.engines.sim.cost import CostModel, prefill_pairs
from daemon.engines.sim.tokenizer import filler_token_id
from daemon.workers.protocol import WorkerStats


@dataclass(frozen=True, kw_only=True)
class SchedulerConfig:
    block_size: int = 16
    num_blocks: int = 4096
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    enable_chunked_prefill: bool = True
    enable_prefix_caching: bool = True
    # Longest sequence (prompt + output) allowed; defaults to the whole KV capacity, which also
    # guarantees that a request running alone always fits, so the scheduler cannot livelock.
    max_model_len: int | None = None
    # A host-memory tier for evicted blocks (vLLM's CPU offloading on a GPU build): how many
    # blocks it holds (0 = none) and what loading one token back costs. The transfer is
    # PCIe: 64 GB/s a direction for 5.0 x16 by the PCI-SIG's figure, about 50 GB/s achieved;
    # Llama-3-8B's KV is 128 KiB a token (32 layers x 8 KV heads x 128 x K and V x 2 bytes),
    # so 2.6 us a token, some 30x cheaper than prefilling it (cost_models/llama3-8b-h100).
    host_kv_blocks: int = 0
    host_load_s_per_token: float = 2.6e-6

    @classmethod
    def from_capacity(
        cls,
        kv_capacity_tokens: int,
        *,
        block_size: int = 16,
        max_num_seqs: int = 64,
        max_num_batched_tokens: int = 2048,
        enable_chunked_prefill: bool = True,
        enable_prefix_caching: bool = True,
        max_model_len: int | None = None,
        host_kv_tokens: int = 0,
    ) -> SchedulerConfig:
        """A config whose pool holds ``kv_capacity_tokens`` rounded down to whole blocks (and
        whose host tier ``host_kv_tokens``)."""
        return cls(
            block_size=block_size,
            num_blocks=kv_capacity_tokens // block_size,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            enable_chunked_prefill=enable_chunked_prefill,
            enable_prefix_caching=enable_prefix_caching,
            max_model_len=max_model_len,
            host_kv_blocks=host_kv_tokens // block_size,
        )

    @property
    def kv_capacity_tokens(self) -> int:
        return self.num_blocks * self.block_size

    @property
    def model_len(self) -> int:
        cap = self.kv_capacity_tokens
        return cap if self.max_model_len is None else min(cap, self.max_model_len)


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"
    FINISHED = "finished"


class RequestRejected(ValueError):
    """The request can never run on this engine (e.g. its prompt exceeds max_model_len)."""


@dataclass(eq=False, kw_only=True)
class SimRequest:
    request_id: str
    prompt_token_ids: list[int]
    max_tokens: int
    # Output length at which the simulated EOS is sampled (reason "stop"); None = never.
    eos_after: int | None = None
    # Output token i is the filler token ``sim<output_offset + i>`` (continues after failover),
    # or, while there are any, the scripted ones (a tool call: daemon/engines/sim/tools.py).
    output_offset: int = 0
    priority: int = 0
    script_token_ids: list[int] = field(default_factory=list)
    program_id: str = ""  # its residency is tracked once it ends; "" = not tracked

    output_token_ids: list[int] = field(default_factory=list)
    all_token_ids: list[int] = field(default_factory=list)
    block_hashes: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    # Cached prompt tokens found at the first admission; -1 until then.
    num_cached_tokens: int = -1
    num_preemptions: int = 0
    status: Status = Status.WAITING
    finish_reason: str | None = None

    def __post_init__(self) -> None:
        if not self.all_token_ids:
            self.all_token_ids = list(self.prompt_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    def next_token_id(self) -> int:
        index = self.output_offset + self.num_output_tokens
        if index < len(self.script_token_ids):
            return self.script_token_ids[index]
        return filler_token_id(index)


@dataclass(frozen=True, slots=True)
class RequestOutput:
    """What one step did for one scheduled request."""

    request_id: str
    new_token_ids: tuple[int, ...]  # empty for a prefill chunk that did not complete the prompt
    num_scheduled_tokens: int
    finish_reason: str | None  # "length" | "stop" | None
    num_prompt_tokens: int
    num_cached_tokens: int
    num_output_tokens: int
    output_offset: int


@dataclass(frozen=True, slots=True)
class StepResult:
    duration_s: float
    outputs: list[RequestOutput]
    num_prefill_tokens: int
    num_decode_seqs: int
    num_context_tokens: int
    preempted: tuple[str, ...]


EMPTY_STEP = StepResult(0.0, [], 0, 0, 0, ())


class SimScheduler:
    """vLLM-v1-like scheduler over a paged KV cache; see the module docstring for one step.

    Called by its driver only: ``add_request`` when a request arrives, ``abort`` when one is
    cancelled, ``step`` whenever ``has_work()`` (the driver then lets ``duration_s`` pass before
    delivering the step's outputs), ``stats`` at any time.
    """

    def __init__(self, config: SchedulerConfig, cost_model: CostModel) -> None:
        self.config = config
        self.cost = cost_model
        self.kv = KVCacheManager(config.num_blocks, config.block_size, config.enable_prefix_caching,
                                 config.host_kv_blocks)
        self._load_tokens = 0  # tokens loaded from the host tier for the step being built
        # Programs' residency from the cache's events, as a vLLM worker learns it from vLLM's.
        self.residency = Residency(config.block_size)
        self.kv.pool.events = []
        self.requests: dict[str, SimRequest] = {}
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []
        self.num_steps = 0
        self.num_preemptions = 0
        self.num_generated_tokens = 0
        self.num_loaded_tokens = 0  # from the host tier

    # --- driver interface -------------------------------------------------------------------

    def add_request(self, req: SimRequest) -> None:
        if req.request_id in self.requests:
            raise RequestRejected(f"duplicate request id {req.request_id!r}")
        if req.num_prompt_tokens == 0:
            raise RequestRejected("empty prompt")
        if req.num_prompt_tokens >= self.config.model_len:
            raise RequestRejected(
                f"prompt of {req.num_prompt_tokens} tokens does not fit max_model_len "
                f"{self.config.model_len}"
            )
        if req.max_tokens < 1:
            raise RequestRejected("max_tokens must be >= 1")
        req.status = Status.WAITING
        self.requests[req.request_id] = req
        self.waiting.append(req)

    def abort(self, request_id: str) -> SimRequest | None:
        """Remove a request wherever it is and free its blocks; None if it is not here."""
        req = self.requests.pop(request_id, None)
        if req is None:
            return None
        if req.status is Status.RUNNING:
            self.running.remove(req)
        else:
            self.waiting.remove(req)
        self.kv.free(req)
        req.status = Status.FINISHED
        req.finish_reason = "abort"
        self._remember(req)
        return req

    def has_work(self) -> bool:
        return bool(self.running or self.waiting)

    def step(self) -> StepResult:
        scheduled, preempted = self._schedule()
        if not scheduled:
            return EMPTY_STEP
        result = self._execute(scheduled, preempted)
        events = self.kv.pool.events
        if events:
            self.residency.apply_all(events)
            events.clear()
        return result

    def _remember(self, req: SimRequest) -> None:
        """`req` ended: track the residency of the context it left for its program."""
        if req.program_id:
            self.residency.remember(req.program_id, keys=list(req.block_hashes))

    def stats(self) -> WorkerStats:
        pool = self.kv.pool
        return WorkerStats(
            kv_capacity_tokens=self.config.kv_capacity_tokens,
            kv_used_tokens=pool.num_used * self.config.block_size,
            running=len(self.running),
            waiting=len(self.waiting),
            prefix_cache_queries=self.kv.queries,
            prefix_cache_hits=self.kv.hits,
            preemptions=self.num_preemptions,
            steps=self.num_steps,
            generated_tokens=self.num_generated_tokens,
        )

    # --- one step ---------------------------------------------------------------------------

    def _schedule(self) -> tuple[list[tuple[SimRequest, int]], list[SimRequest]]:
        budget = self.config.max_num_batched_tokens
        scheduled: list[tuple[SimRequest, int]] = []
        preempted: list[SimRequest] = []
        running = self.running
        i = 0
        while i < len(running) and budget > 0:
            req = running[i]
            num_new = min(req.num_tokens - req.num_computed_tokens, budget)
            while not self.kv.allocate_slots(req, num_new):
                victim = running.pop()
                self._preempt(victim)
                preempted.append(victim)
                if victim is req:
                    break
            else:
                scheduled.append((req, num_new))
                budget -= num_new
                i += 1
                continue
            break
        if not preempted:
            budget = self._admit(budget, scheduled)
        return scheduled, preempted

    def _admit(self, budget: int, scheduled: list[tuple[SimRequest, int]]) -> int:
        waiting = self.waiting
        cfg = self.config
        while waiting and budget > 0 and len(self.running) < cfg.max_num_seqs:
            req = waiting[0]
            computed = self.kv.get_computed_blocks(req)
            # What the host tier holds after the pool's hits is loaded, not prefilled: it
            # needs blocks in the pool but none of the step's token budget.
            loaded = self.kv.host_run(req, len(computed)) * cfg.block_size
            num_cached = len(computed) * cfg.block_size + loaded
            num_new = req.num_tokens - num_cached
            if not cfg.enable_chunked_prefill and num_new > budget:
                break
            num_new = min(num_new, budget)
            if not self.kv.allocate_slots(req, num_new + loaded, computed):
                break
            self._load_tokens += loaded
            waiting.popleft()
            req.num_computed_tokens = num_cached
            if req.num_cached_tokens < 0:
                req.num_cached_tokens = num_cached
            req.status = Status.RUNNING
            self.running.append(req)
            scheduled.append((req, num_new))
            budget -= num_new
        return budget

    def _preempt(self, req: SimRequest) -> None:
        self.kv.free(req)
        req.num_computed_tokens = 0
        req.num_preemptions += 1
        req.status = Status.PREEMPTED
        self.waiting.appendleft(req)
        self.num_preemptions += 1

    def _execute(
        self, scheduled: list[tuple[SimRequest, int]], preempted: list[SimRequest]
    ) -> StepResult:
        prefill_tokens = decode_seqs = context = 0
        pairs = 0.0
        outputs: list[RequestOutput] = []
        any_finished = False
        model_len = self.config.model_len
        for req, num_new in scheduled:
            before = req.num_computed_tokens
            if num_new == 1 and req.output_token_ids and before == req.num_tokens - 1:
                decode_seqs += 1
            else:
                prefill_tokens += num_new
                pairs += prefill_pairs(num_new, before)
            context += before + num_new
            req.num_computed_tokens = before + num_new
            new: tuple[int, ...] = ()
            reason: str | None = None
            if req.num_computed_tokens == req.num_tokens:
                tok = req.next_token_id()
                req.output_token_ids.append(tok)
                req.all_token_ids.append(tok)
                new = (tok,)
                n_out = req.num_output_tokens
                if req.eos_after is not None and n_out >= req.eos_after:
                    reason = "stop"
                elif n_out >= req.max_tokens or req.num_tokens >= model_len:
                    reason = "length"
            if reason is not None:
                any_finished = True
                self._finish(req, reason)
            outputs.append(
                RequestOutput(
                    req.request_id, new, num_new, reason, req.num_prompt_tokens,
                    max(req.num_cached_tokens, 0), req.num_output_tokens, req.output_offset,
                )
            )
        if any_finished:
            self.running = [r for r in self.running if r.status is Status.RUNNING]
        self.num_steps += 1
        self.num_generated_tokens += sum(1 for o in outputs if o.new_token_ids)
        return StepResult(
            duration_s=self.cost.step_time(prefill_tokens, decode_seqs, context, pairs)
            + self._take_load_s(),
            outputs=outputs,
            num_prefill_tokens=prefill_tokens,
            num_decode_seqs=decode_seqs,
            num_context_tokens=context,
            preempted=tuple(r.request_id for r in preempted),
        )

    def _take_load_s(self) -> float:
        loaded, self._load_tokens = self._load_tokens, 0
        self.num_loaded_tokens += loaded
        return loaded * self.config.host_load_s_per_token

    def _finish(self, req: SimRequest, reason: str) -> None:
        self.kv.free(req)
        req.status = Status.FINISHED
        req.finish_reason = reason
        del self.requests[req.request_id]
        self._remember(req)
