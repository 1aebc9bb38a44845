"""The virtual-time replay loop: the KV policy layer (and optionally the SLO layer) over
N simulated workers, driven by one virtual clock.

Every ``check_interval_s`` the KV policy decides on a fresh ``KvView``; ``route`` is
called when a program's request becomes ready and ``on_request_end`` when a program
marked for pausing finishes its request, as ``scheduling.kv`` asks. Decisions are applied
in order; one made stale by an earlier one is skipped.

Program-level KV is never pinned in the engine, exactly as in vLLM: a request's blocks are
freed into the LRU prefix cache when it ends, whether its program is ACTING or PAUSED. A
policy protects a program's cache only by keeping other programs' requests off the
worker; pausing means "its next request waits in the global queue", and a restored
program hits only on blocks the LRU has not yet reused. Token counts come from the sim.

Runs are deterministic: every tie breaks on a sequence number, and no wall clock is read
except for the reported ``wall_s``.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from daemon.engines.sim import CostModel, SchedulerConfig, TimedStep, load_cost_model
from daemon.replay.metrics import RequestRecord, RunTotals, Samples, result_row
from daemon.replay.programs import ProgramRun
from daemon.replay.residency import ResidencyProbe
from daemon.replay.slo import SloLayer, SloStack
from daemon.replay.worker import SimWorker
from daemon.replay.workload import ProgramSpec
from scheduling.kv import (
    Admit,
    Decision,
    KvConfig,
    KvPolicy,
    KvView,
    MarkPauseAfterRequest,
    Pause,
    ProgramStatus,
    Restore,
    WorkerView,
)
from scheduling.slo.templates import TABLE_6, SloTable, TaskType

_START, _READY, _DONE, _KV_TICK, _SLO_TICK = range(5)
# Past any run here (8.4M tokens): what "unlimited" means for the no-thrash bound.
UNLIMITED_KV = 1 << 23


@dataclass(frozen=True)
class ReplayConfig:
    workers: int = 2
    kv_tokens: int = 444_000  # per worker; UNLIMITED_KV for the no-thrash bound
    cost_model: str = "llama3-8b-h100"
    max_num_seqs: int = 256
    max_batched_tokens: int = 8192
    block_size: int = 16
    concurrency: int | None = None  # live-program cap (closed loop); None = open loop
    duration_s: float | None = None
    time_scale: float = 1.0  # multiplies modelled step time
    kv: KvConfig = field(default_factory=KvConfig)
    slo_tick_s: float = 1.0
    progress_every_s: float = 0.0  # wall seconds between stderr lines; 0 = quiet
    # What the policy is told of a paused program's cache: the sim's truth ("engine"), the
    # daemon's estimate from reported token counts ("estimate"), None ("unknown") or False
    # ("cold"); see replay/residency.py.
    residency: str = "engine"

    def scheduler_config(self) -> SchedulerConfig:
        # The model length stays a real model's, so unlimited KV does not unbound requests.
        return SchedulerConfig.from_capacity(
            self.kv_tokens, block_size=self.block_size, max_num_seqs=self.max_num_seqs,
            max_num_batched_tokens=self.max_batched_tokens, max_model_len=131_072,
        )

    def load_cost(self) -> CostModel:
        cost = load_cost_model(self.cost_model)
        s = self.time_scale
        return CostModel(name=cost.name, c0=cost.c0 * s, c_prefill=cost.c_prefill * s,
                         c_decode=cost.c_decode * s, c_attn=cost.c_attn * s,
                         c_pf=cost.c_pf * s, source=cost.source, defaults=cost.defaults)


class Replay:
    """One run: one KV policy, optionally one SLO stack, over a list of programs."""

    def __init__(
        self, specs: list[ProgramSpec], config: ReplayConfig, policy: KvPolicy,
        slo: SloStack | None = None, label: str = "", slos: SloTable | None = None,
    ) -> None:
        self.config, self.policy, self.label = config, policy, label or policy.name
        cost, sched = config.load_cost(), config.scheduler_config()
        self.workers = {f"w{i}": SimWorker(f"w{i}", sched, cost) for i in range(config.workers)}
        self.programs = {s.program_id: ProgramRun(s) for s in specs}
        # Live programs as sorted positions in ``programs``: views list them in that order
        # without scanning every program of the trace on each routing call.
        self._runs = list(self.programs.values())
        self._position = {pid: i for i, pid in enumerate(self.programs)}
        self._live: list[int] = []
        self.backlog = deque(sorted(self.programs.values(),
                                    key=lambda p: (p.spec.arrival_s, p.pid)))
        self.slo = SloLayer(slo, list(self.workers), sched, cost, slos) if slo else None
        self.now = 0.0
        self.live = 0
        self.records: dict[str, RequestRecord] = {}
        self.by_request: dict[str, ProgramRun] = {}
        self.latencies: list[float] = []
        self.samples = Samples()
        self.seen_blocks: set[int] = set()
        self._heap: list[tuple[float, int, int, Any]] = []
        self._seq = itertools.count()
        self._end_hook = type(policy).on_request_end is not KvPolicy.on_request_end
        self.residency = ResidencyProbe(config.residency)

    # --- main loop --------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        wall = time.perf_counter()
        self._admit_backlog()
        self._push(0.0, _KV_TICK, None)
        if self.slo:
            self._push(0.0, _SLO_TICK, None)
        progress = Progress(self.label, self.config.progress_every_s)
        while self._advance():
            progress.maybe(self.now, len(self.latencies), len(self.programs))
        row = result_row(self._totals(), self.policy.name,
                         self.slo.stack.name if self.slo else "none",
                         time.perf_counter() - wall)
        return {**row, **self.residency.row()}

    def _advance(self) -> bool:
        t_ev = self._heap[0][0] if self._heap else float("inf")
        t_step, worker = min((_or_inf(w.next_step_at(self.now)), w.worker_id)
                             for w in self.workers.values())
        t = min(t_ev, t_step)
        limit = self.config.duration_s
        if t == float("inf") or (limit is not None and t > limit) or self._finished():
            return False
        self.now = max(self.now, t)
        if t_ev <= t_step:
            _, _, kind, payload = heapq.heappop(self._heap)
            self._handle(kind, payload)
        else:
            step = self.workers[worker].start_step(self.now)
            self._push(step.end, _DONE, (worker, step))
            self._report_hits(worker, step)
        return True

    def _report_hits(self, worker: str, step: TimedStep) -> None:
        # Usage grew by the hits when the step was scheduled; a daemon learns of them
        # from the first token delta, a step later at most.
        for out in step.result.outputs:
            if out.num_cached_tokens > 0:
                prog = self.by_request[out.request_id]
                self.residency.request_hit(prog.pid, worker, out.num_cached_tokens)

    def _finished(self) -> bool:
        return not self.backlog and self.live == 0

    def _push(self, at: float, kind: int, payload: Any) -> None:
        heapq.heappush(self._heap, (at, next(self._seq), kind, payload))

    def _handle(self, kind: int, payload: Any) -> None:
        if kind == _START:
            self._start(payload)
        elif kind == _READY:
            self._ready(payload)
        elif kind == _DONE:
            self._step_done(*payload)
        elif kind == _KV_TICK:
            self._kv_tick()
        else:
            self._slo_tick()

    # --- program lifecycle ------------------------------------------------------------

    def _admit_backlog(self) -> None:
        """Start backlog programs while the closed loop has room, each at its arrival."""
        cap = self.config.concurrency
        while self.backlog and (cap is None or self.live < cap):
            prog = self.backlog.popleft()
            self.live += 1
            self._push(max(self.now, prog.spec.arrival_s), _START, prog)

    def _start(self, prog: ProgramRun) -> None:
        prog.started_at = self.now
        bisect.insort(self._live, self._position[prog.pid])
        prog.status = ProgramStatus.QUEUED
        self._make_ready(prog)
        self._route(prog)

    def _make_ready(self, prog: ProgramRun) -> None:
        prog.prepare(self.config.block_size)
        prog.pending, prog.ready_since = True, self.now
        step = prog.spec.steps[prog.index]
        task = prog.spec.task or TaskType.UNKNOWN.value
        slo = TABLE_6.get(TaskType(task), TABLE_6[TaskType.UNKNOWN])
        rid = f"{prog.pid}#{prog.index}"
        self.records[rid] = RequestRecord(
            rid, prog.pid, "", prog.spec.tenant, task, self.now, step.prompt_tokens,
            self._ideal_cached(prog), slo.ttft_s, slo.tpot_s,
        )
        if self.slo:
            self.slo.perceive(self.records[rid])

    def _ideal_cached(self, prog: ProgramRun) -> int:
        limit = (len(prog.prompt) - 1) // self.config.block_size
        hits = 0
        for h in prog.prompt_hashes[:limit]:
            if h not in self.seen_blocks:
                break
            hits += 1
        return hits * self.config.block_size

    def _ready(self, prog: ProgramRun) -> None:
        prog.tool_times.append(prog.spec.steps[prog.index].tool_s)
        self._make_ready(prog)
        if prog.status is ProgramStatus.ACTING:
            target = self.policy.route(self.view(), prog.pid, self.now)
            if target is None:
                prog.status = ProgramStatus.PAUSED
            else:
                self._bind(prog, target)
        else:
            self._route(prog)

    def _route(self, prog: ProgramRun) -> None:
        target = self.policy.route(self.view(), prog.pid, self.now)
        if target is not None:
            self._bind(prog, target)

    def _bind(self, prog: ProgramRun, worker: str) -> None:
        prog.worker = worker
        if not prog.pending:
            prog.status = ProgramStatus.ACTING
            return
        prog.status, prog.pending = ProgramStatus.REASONING, False
        req = prog.make_request()
        prog.request = req
        self.by_request[req.request_id] = prog
        record = self.records[req.request_id]
        record.worker = worker
        if self.slo:
            self.slo.enqueue(record, self.now)
            self._pump(worker)
        else:
            self._submit(worker, req.request_id)

    def _submit(self, worker: str, request_id: str) -> None:
        prog = self.by_request[request_id]
        assert prog.request is not None
        self.records[request_id].dispatch = self.now
        self.workers[worker].submit(prog.request)

    def _pump(self, worker: str) -> None:
        assert self.slo is not None
        for rid in self.slo.pump(worker, self.now):
            self._submit(worker, rid)

    def _step_done(self, worker: str, step: TimedStep) -> None:
        self.workers[worker].end_step()
        for out in step.result.outputs:
            record = self.records[out.request_id]
            if out.new_token_ids and record.first_token is None:
                record.first_token = step.end
            if out.finish_reason is not None:
                self._request_end(out.request_id, out.num_cached_tokens, out.num_output_tokens)
        for rid in step.result.preempted:
            self.records[rid].preemptions += 1
        if self.slo:
            self._pump(worker)

    def _request_end(self, rid: str, cached: int, output: int) -> None:
        prog, record = self.by_request.pop(rid), self.records[rid]
        record.finish, record.cached_tokens, record.output_tokens = self.now, cached, output
        req = prog.request
        assert req is not None
        prog.request, prog.context, prog.hashes = None, req.all_token_ids, req.block_hashes
        self.seen_blocks.update(req.block_hashes)
        self._residency_end(prog, req.prompt_token_ids, cached, output)
        if self.slo:
            self.slo.on_finished(record, self.now)
        prog.index += 1
        if prog.index == len(prog.spec.steps):
            self._stop(prog)
            return
        prog.status, prog.acting_since = ProgramStatus.ACTING, self.now
        self._push(self.now + prog.spec.steps[prog.index].tool_s, _READY, prog)
        if prog.pause_marked or self._end_hook:
            self._apply(self.policy.on_request_end(self.view(), prog.pid, self.now))

    def _residency_end(self, prog: ProgramRun, prompt: list[int], cached: int,
                       output: int) -> None:
        assert prog.worker is not None
        worker = self.workers[prog.worker]
        # The sim has freed the request's blocks by now, as the estimator wants.
        self.residency.request_ended(prog.pid, prog.worker, len(prompt), max(0, cached), output,
                                     worker.used_tokens, worker.capacity_tokens,
                                     self.config.block_size)

    def _stop(self, prog: ProgramRun) -> None:
        self.residency.stopped(prog.pid)
        prog.status, prog.finished_at, prog.worker = ProgramStatus.STOPPED, self.now, None
        del self._live[bisect.bisect_left(self._live, self._position[prog.pid])]
        prog.context, prog.hashes = [], []
        assert prog.started_at is not None
        self.latencies.append(self.now - prog.started_at)
        self.live -= 1
        self._admit_backlog()

    # --- KV policy --------------------------------------------------------------------

    def view(self) -> KvView:
        workers = tuple(WorkerView(w.worker_id, w.capacity_tokens, w.used_tokens)
                        for w in self.workers.values())
        runs = self._runs
        programs = tuple(runs[i].view(self._kv_resident(runs[i])) for i in self._live)
        return KvView(workers, programs, self.config.kv)

    def _kv_resident(self, prog: ProgramRun) -> bool | None:
        if prog.status is not ProgramStatus.PAUSED or prog.worker is None:
            return False
        # The LRU evicts a freed request's tail first, so its last block is the first to go.
        worker = self.workers[prog.worker]
        truth = bool(prog.hashes) and worker.is_cached(prog.hashes[-1])
        return self.residency.seen(prog.pid, prog.worker, worker.used_tokens, truth)

    def _kv_tick(self) -> None:
        self._apply(self.policy.decide(self.view(), self.now))
        live = [self._runs[i] for i in self._live]
        paused = sum(1 for p in live if p.status is ProgramStatus.PAUSED)
        self.samples.add([w.used_fraction for w in self.workers.values()], paused, len(live))
        if not self._finished():
            self._push(self.now + self.config.kv.check_interval_s, _KV_TICK, None)

    def _apply(self, decisions: list[Decision]) -> None:
        for d in decisions:
            prog = self.programs[d.program_id]
            if isinstance(d, Admit | Restore):
                if prog.status in (ProgramStatus.QUEUED, ProgramStatus.PAUSED):
                    self._bind(prog, d.worker_id)
            elif isinstance(d, Pause):
                self._pause(prog)
            elif isinstance(d, MarkPauseAfterRequest):
                prog.pause_marked, prog.migrate_to = True, d.restore_on

    def _pause(self, prog: ProgramRun) -> None:
        if prog.status is ProgramStatus.REASONING:
            prog.pause_marked = True  # a running request is never cut short here
        elif prog.status is ProgramStatus.ACTING:
            prog.status, prog.pause_marked, prog.migrate_to = ProgramStatus.PAUSED, False, None

    # --- SLO layer --------------------------------------------------------------------

    def _slo_tick(self) -> None:
        assert self.slo is not None
        self.slo.tick(self.now, self.workers)
        for worker in self.workers:
            self._pump(worker)
        if not self._finished():
            self._push(self.now + self.config.slo_tick_s, _SLO_TICK, None)

    def _totals(self) -> RunTotals:
        elapsed = self.now if self.config.duration_s is None else self.config.duration_s
        return RunTotals(
            list(self.records.values()), self.latencies, self.samples,
            sum(w.prefill_tokens for w in self.workers.values()), elapsed,
            self.slo.switches if self.slo else 0, self.slo.rollbacks if self.slo else 0,
        )


def _or_inf(t: float | None) -> float:
    return float("inf") if t is None else t


class Progress:
    """A stderr line every ``every_s`` wall seconds, for long runs."""

    def __init__(self, label: str, every_s: float, out: Callable[[str], Any] | None = None):
        self.label, self.every_s = label, every_s
        self.out = out or (lambda s: print(s, file=sys.stderr, flush=True))
        self._next = time.perf_counter() + every_s

    def maybe(self, now: float, done: int, total: int) -> None:
        if self.every_s <= 0 or time.perf_counter() < self._next:
            return
        self._next = time.perf_counter() + self.every_s
        self.out(f"[replay {self.label}] t={now:.0f}s programs {done}/{total} done")
