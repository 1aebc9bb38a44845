"""The daemon in virtual time: `agentd replay` runs the daemon's own core (dispatch, the KV
loop, the SLO stack with its meta loop and stability agent, the policy registry) on a
virtual clock, with simulated workers in this process instead of over ZeroMQ.

Nothing here decides anything: the replay only does what the outside world does for a
running daemon. It delivers the trace's programs as clients would (open a program, send
each step's prompt as token ids, wait its tool time, release it at the end), runs the
workers' steps when virtual time reaches them and answers the core as workers do
(`ReplayWorkers`), and fires the core's periodic loops at their configured periods (the
health check and heartbeats, the KV loop, the SLO cycle). The store is a real SQLite file
in a temporary directory, written in the background as in the daemon.

The configuration is the daemon's (`daemon.config.Config`, from the same TOML file as
`agentd start --config`): every scheduling key means the same here. What the replay adds
is the simulated hardware (`Hardware`) and the workload.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import secrets
import sys
import tempfile
import time
from collections import deque
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from daemon.config import Config
from daemon.core.core import Core
from daemon.core.tenants import open_program
from daemon.engines.sim import CostModel, SchedulerConfig, load_cost_model
from daemon.engines.sim.cost import DEFAULT_COST_MODEL
from daemon.errors import CoreError
from daemon.policies.registry import PolicyService
from daemon.replay.metrics import RequestRecord, RunTotals, Samples, result_row
from daemon.replay.workers import ReplayWorkers
from daemon.replay.workload import ProgramSpec, first_prompt, next_prompt
from daemon.state import ProgramState, ProgramStatus, RequestState, RequestStatus
from daemon.workers import protocol
from db.engine import make_engine, make_sessionmaker, upgrade
from db.writer import BatchWriter
from scheduling.slo.templates import TaskType

_ARRIVE, _READY, _STEP_DONE, _HEARTBEAT, _KV_TICK, _SLO_TICK, _REPLY = range(7)
MODEL = "sim-replay"


@dataclass(frozen=True)
class Hardware:
    """The simulated workers: how many, their KV and batch limits, their speed."""

    # The defaults are the daemon's simulated worker's (`agentd worker --engine sim`).
    workers: int = 1
    kv_tokens: int = 65536  # per worker
    cost_model: str = DEFAULT_COST_MODEL
    max_num_seqs: int = 64
    max_batched_tokens: int = 2048
    block_size: int = 16
    time_scale: float = 1.0  # multiplies modelled step time
    host_kv_tokens: int = 0  # per worker: a host-memory tier for evicted blocks (GPU offload)

    def scheduler_config(self) -> SchedulerConfig:
        # The model length stays a real model's, so a large KV does not unbound requests.
        return SchedulerConfig.from_capacity(
            self.kv_tokens, block_size=self.block_size, max_num_seqs=self.max_num_seqs,
            max_num_batched_tokens=self.max_batched_tokens, max_model_len=131_072,
            host_kv_tokens=self.host_kv_tokens)

    def cost(self) -> CostModel:
        cost, s = load_cost_model(self.cost_model), self.time_scale
        return replace(cost, c0=cost.c0 * s, c_prefill=cost.c_prefill * s,
                       c_decode=cost.c_decode * s, c_attn=cost.c_attn * s, c_pf=cost.c_pf * s)


@dataclass(frozen=True)
class Workload:
    concurrency: int | None = None  # live-program cap (closed loop); None = open loop
    duration_s: float | None = None  # stop at this virtual time
    progress_every_s: float = 0.0  # wall seconds between stderr lines; 0 = quiet


@dataclass(eq=False)
class _Program:
    spec: ProgramSpec
    index: int = 0
    state: ProgramState | None = None
    context: list[int] = field(default_factory=list)
    started_at: float = 0.0
    refused: bool = False  # a request of it was refused: the client gives up


class SocketOrder:
    """The core's link to the replay's workers, in a socket's order.

    A simulated worker answers some messages while the core is still sending them: a
    Submit the engine rejects (a prompt over its model length or its whole KV) gets its
    error Finish, an Abort its Finish. Over ZeroMQ those replies reach the daemon only
    after the step that sent them is over; delivered inside the send, the core would end
    the request in the middle of dispatching it and then finish the dispatch (the fence
    reserving room for a request already gone, the program marked as running). So replies
    made during a send are queued (`deferred`) and the replay delivers them next."""

    def __init__(self, workers: ReplayWorkers) -> None:
        self.workers = workers
        self.endpoint = workers.endpoint
        self.sending = False

    def use_worker_key(self, key: str, *, encrypt_ipc: bool = False) -> None:
        self.workers.use_worker_key(key, encrypt_ipc=encrypt_ipc)

    def start(self) -> None:
        self.workers.start()

    async def stop(self) -> None:
        await self.workers.stop()

    def send(self, identity: bytes, message: protocol.DaemonMessage) -> None:
        self.sending = True
        try:
            self.workers.send(identity, message)
        finally:
            self.sending = False

    def send_frame(self, identity: bytes, frame: bytes, what: str) -> None:
        self.sending = True
        try:
            self.workers.send_frame(identity, frame, what)
        finally:
            self.sending = False


class VirtualLoop(asyncio.SelectorEventLoop):
    """An event loop on the replay's clock: the timers the daemon's code sets (call_later,
    sleeps, timeouts) fall due in virtual time, when the replay lets the loop run."""

    def __init__(self) -> None:
        super().__init__()
        self.virtual_now = 0.0

    def time(self) -> float:
        return self.virtual_now


def replay(specs: list[ProgramSpec], config: Config, hardware: Hardware, workload: Workload,
           label: str = "", store: Path | None = None) -> dict[str, Any]:
    """One run on a virtual-time loop of its own; its result row."""
    with asyncio.Runner(loop_factory=VirtualLoop) as runner:
        return runner.run(VirtualDaemon(specs, config, hardware, workload, label, store).run())


class VirtualDaemon:
    """One replay of `specs` through a daemon configured by `config`."""

    def __init__(self, specs: list[ProgramSpec], config: Config, hardware: Hardware,
                 workload: Workload, label: str = "", store: Path | None = None) -> None:
        self.config, self.workload = config, workload
        self.store = store
        self.label = label or f"{config.kv_policy}/{config.ordering_policy}"
        self.now = 0.0
        self.workers = ReplayWorkers(hardware.workers, hardware.scheduler_config(),
                                     hardware.cost(), MODEL, secrets.token_hex(16))
        self.link = SocketOrder(self.workers)
        self.refused = 0  # requests the daemon or an engine refused as unservable
        self.backlog = deque(sorted((_Program(s) for s in specs),
                                    key=lambda p: (p.spec.arrival_s, p.spec.program_id)))
        self.total = len(self.backlog)
        self.live = 0
        self.by_core_id: dict[str, _Program] = {}
        self.records: list[RequestRecord] = []
        self.latencies: list[float] = []
        self.samples = Samples()
        self._heap: list[tuple[float, int, int, Any]] = []
        self._seq = itertools.count()
        self._ended: list[_Program] = []
        self._slos: dict[str, tuple[float, float, int]] = {}  # the SLO tagging gave each request

    async def run(self) -> dict[str, Any]:
        wall = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="agentd-replay-") as tmp:
            # The policy registry keeps its versions in a store of its own; the run's
            # programs, requests and traces are kept only in a --store file.
            url = f"sqlite+aiosqlite:///{self.store or Path(tmp) / 'replay.db'}"
            await upgrade(url)
            engine = make_engine(url)
            writer = BatchWriter(engine, interval_s=0.5, max_batch=20_000,
                                 keep=self.store is not None, clock=lambda: self.now)
            writer.start()
            try:
                core = await self._start_core(writer, make_sessionmaker(engine))
                await self._loop(core)
                switches, rollbacks = core.slo.stats.switches, core.slo.stats.rollbacks
                ordering = core.slo.ordered.policy_name
            finally:
                await writer.stop()
                await engine.dispose()
        elapsed = self.now if self.workload.duration_s is None else self.workload.duration_s
        prefill = sum(w.prefill_tokens for w in self.workers.workers.values())
        totals = RunTotals(self.records, self.latencies, self.samples, prefill, elapsed,
                           switches, rollbacks)
        row = result_row(totals, self.config.kv_policy, self.config.meta_policy,
                         time.perf_counter() - wall)
        return {**row, "refused": self.refused, "label": self.label, "final_ordering": ordering}

    async def _start_core(self, writer: BatchWriter, sessions: Any) -> Core:
        numbers = itertools.count()
        core = Core(self.config, writer, sessions, clock=lambda: self.now, link=self.link,
                    ids=lambda prefix: f"{prefix}-{next(numbers):08d}")
        core.worker_key = self.workers.key

        def deliver(identity: bytes, message: protocol.WorkerMessage) -> None:
            if self.link.sending:
                self._push(self.now, _REPLY, (identity, message))
            else:
                core.on_worker_message(identity, message)

        self.workers.deliver = deliver
        self.workers.register_all()
        await PolicyService.start(core)
        core.on_request_end.append(self._request_ended)
        return core

    # --- the event loop ---------------------------------------------------------------

    async def _loop(self, core: Core) -> None:
        cfg = self.config
        loop = asyncio.get_running_loop()
        self._admit_backlog()
        self._push(0.0, _HEARTBEAT, None)
        self._push(core.kv.config.check_interval_s, _KV_TICK, None)
        self._push(core.slo.settings.cycle_s, _SLO_TICK, None)
        limit = self.workload.duration_s
        progress = Progress(self.label, self.workload.progress_every_s, limit)
        while self.backlog or self.live:
            t_event = self._heap[0][0] if self._heap else float("inf")
            t_step, worker = min(self.workers.steps_due(self.now), default=(float("inf"), ""))
            t = min(t_event, t_step)
            if t == float("inf") or (limit is not None and t > limit):
                break
            self.now = max(self.now, t)
            if isinstance(loop, VirtualLoop):
                loop.virtual_now = self.now
            if t_step < t_event:
                step = self.workers.workers[worker].start_step(self.now)
                self._push(step.end, _STEP_DONE, (worker, step))
                continue
            _, _, kind, payload = heapq.heappop(self._heap)
            if kind in (_ARRIVE, _READY):
                await self._open(core, payload)
            elif kind == _STEP_DONE:
                self.workers.step_done(*payload)
            elif kind == _REPLY:
                core.on_worker_message(*payload)
            elif kind == _HEARTBEAT:
                self.workers.heartbeat()
                core.health_tick()
                self._push(self.now + cfg.heartbeat_interval_s, _HEARTBEAT, None)
                # The daemon's own timers (forgetting ended programs and requests, the
                # store writer) fall due on the loop's virtual clock.
                await asyncio.sleep(0)
                progress.maybe(self.now, len(self.records), len(self.latencies), self.total)
            elif kind == _KV_TICK:
                core.kv.tick()
                self._sample()
                self._push(self.now + core.kv.config.check_interval_s, _KV_TICK, None)
            else:
                core.slo.tick(self.now)
                await asyncio.sleep(0)  # the long view builds in steps on the loop
                self._push(self.now + core.slo.settings.cycle_s, _SLO_TICK, None)
            if self._ended:
                self._end_programs(core)

    def _push(self, at: float, kind: int, payload: Any) -> None:
        heapq.heappush(self._heap, (at, next(self._seq), kind, payload))

    # --- programs, as clients run them ---------------------------------------------------

    def _admit_backlog(self) -> None:
        cap = self.workload.concurrency
        while self.backlog and (cap is None or self.live < cap):
            prog = self.backlog.popleft()
            self.live += 1
            self._push(max(self.now, prog.spec.arrival_s), _ARRIVE, prog)

    async def _open(self, core: Core, prog: _Program) -> None:
        if prog.state is None:
            prog.started_at = self.now
            prog.state = await open_program(core, None, None, prog.spec.tenant)
            self.by_core_id[prog.state.id] = prog
            # The trace names the task the tagging rules would read from the text.
            task = TaskType(prog.spec.task or TaskType.UNKNOWN.value)
            core.slo.tagging.program_task[prog.state.id] = task
        self._submit(core, prog)

    def _submit(self, core: Core, prog: _Program) -> None:
        assert prog.state is not None
        step = prog.spec.steps[prog.index]
        ids = (first_prompt(prog.spec) if prog.index == 0
               else next_prompt(prog.spec, prog.index, prog.context)[0])
        try:
            req = core.submit(prog.state, "completion", MODEL,
                              protocol.SamplingParams(max_tokens=step.output_tokens),
                              prompt_token_ids=ids)
        except CoreError as exc:  # the API would answer it with exc.status; the client stops
            self._refuse(prog, str(exc))
            return
        tag = core.slo.tags.get(req.id)
        if tag is not None:
            self._slos[req.id] = (tag.slo.ttft_s, tag.slo.tpot_s, tag.l_pred)

    def _request_ended(self, req: RequestState, finish: protocol.Finish | None) -> None:
        prog = self.by_core_id.get(req.program_id)
        if prog is None:
            return  # the daemon's own calls
        if req.status is RequestStatus.FAILED:  # an engine refused it (or it could not be sent)
            self.workers.finished.pop(req.id, None)
            self._refuse(prog, "the engine refused it")
            return
        self.records.append(self._record(prog, req))
        sim = self.workers.finished.pop(req.id, None)
        prog.context = sim.all_token_ids if sim is not None else prog.context
        prog.index += 1
        if finish is None or finish.reason == "abort" or prog.index == len(prog.spec.steps):
            self._ended.append(prog)
        else:
            self._push(self.now + prog.spec.steps[prog.index].tool_s, _READY, prog)

    def _refuse(self, prog: _Program, reason: str) -> None:
        """The request was refused as the daemon refuses it (at submit, or its engine's
        error); the program, like a client that got an error, ends."""
        self.refused += 1
        prog.refused = True
        self._ended.append(prog)
        if self.workload.progress_every_s > 0:
            print(f"[replay {self.label}] refused a request of {prog.spec.program_id}: "
                  f"{reason}", file=sys.stderr, flush=True)

    def _record(self, prog: _Program, req: RequestState) -> RequestRecord:
        task = prog.spec.task or TaskType.UNKNOWN.value
        ttft, tpot, l_pred = self._slos.pop(req.id, (0.0, 0.0, 0))
        return RequestRecord(
            request_id=req.id, program_id=prog.spec.program_id, worker=req.worker_id or "",
            tenant=prog.spec.tenant, task=task, arrival=req.queued_at,
            prompt_tokens=req.prompt_tokens,
            ideal_cached=self.workers.ideal_cached.pop(req.id, 0), slo_ttft_s=ttft,
            slo_tpot_s=tpot, l_pred=l_pred, dispatch=req.dispatched_at or req.queued_at,
            first_token=req.first_token_at, finish=req.finished_at,
            cached_tokens=req.cached_tokens, output_tokens=req.output_tokens,
            preemptions=self.workers.preemptions.pop(req.id, 0))

    def _end_programs(self, core: Core) -> None:
        ended, self._ended = self._ended, []
        for prog in ended:
            assert prog.state is not None
            core.set_program_status(prog.state, ProgramStatus.STOPPED, "released")
            del self.by_core_id[prog.state.id]
            if not prog.refused:
                self.latencies.append(self.now - prog.started_at)
            self.live -= 1
        self._admit_backlog()

    def _sample(self) -> None:
        states = [p.state for p in self.by_core_id.values() if p.state is not None]
        paused = sum(1 for p in states if p.status == ProgramStatus.PAUSED)
        self.samples.add([w.used_fraction for w in self.workers.workers.values()], paused,
                         len(states))


class Progress:
    """A stderr line every ``every_s`` wall seconds, for long runs: virtual time reached,
    requests and programs done, and the wall time left at the pace so far (from virtual
    time against the run's end when it has one, else from programs done)."""

    def __init__(self, label: str, every_s: float, end_s: float | None = None) -> None:
        self.label, self.every_s, self.end_s = label, every_s, end_s
        self._start = time.perf_counter()
        self._next = self._start + every_s

    def maybe(self, now: float, requests: int, programs: int, total: int) -> None:
        wall = time.perf_counter()
        if self.every_s <= 0 or wall < self._next:
            return
        self._next = wall + self.every_s
        until = f"/{self.end_s:.0f}" if self.end_s is not None else ""
        print(f"[replay {self.label}] t={now:.0f}{until}s requests {requests} done, "
              f"programs {programs}/{total}, ETA {self.eta(now, programs, total, wall)}",
              file=sys.stderr, flush=True)

    def eta(self, now: float, programs: int, total: int, wall: float) -> str:
        share = now / self.end_s if self.end_s else programs / max(total, 1)
        if share <= 0:
            return "?"
        left = (wall - self._start) * (1 - min(share, 1.0)) / share
        return f"{left:.0f}s"
