"""The daemon core: programs, requests, workers, and the dispatch loop.

Everything that changes scheduling state happens here, on the event loop,
without awaiting disk: state lives in memory (daemon/state.py) and every
change is enqueued on the batched writer together with its trace event.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections import deque
from collections.abc import Callable
from typing import Any

from sqlalchemy.ext.asyncio import async_sessionmaker

from daemon import lru
from daemon.config import Config
from daemon.core.dispatching import CoreLayers
from daemon.core.expiry import ProgramExpiry
from daemon.core.exposition import RequestMetrics, core_families
from daemon.core.fit import refuse_unservable
from daemon.core.lineage import Lineage
from daemon.core.programs import ProgramLifecycle
from daemon.core.worker_health import WorkerHealth
from daemon.errors import CoreError
from daemon.kv.loop import KvControl
from daemon.metrics import DaemonMetrics
from daemon.slo.exposition import slo_families
from daemon.slo.llm import LlmCaller
from daemon.slo.settings import parse_settings
from daemon.slo.stack import SloControl
from daemon.state import (
    ProgramState,
    ProgramStatus,
    RequestState,
    RequestStatus,
    StreamItem,
    WorkerState,
)
from daemon.workers import protocol
from daemon.workers.broker import Broker, WorkerLink
from daemon.workers.counts import (
    ProtocolTallies,
    clean_delta,
    clean_finish,
)
from daemon.workers.key import ensure_worker_key
from daemon.workers.watch import ProgressWatch
from db.writer import BatchWriter
from scheduling.dispatch import Decision, Park, Refuse, StillParked, dispatch
from scheduling.kv import KvConfig

log = logging.getLogger("agentd.core")


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:16]}"


class Core(ProgramLifecycle, WorkerHealth):
    """The daemon's live state and the one place that changes it: requests (submit, the
    dispatch step's decisions applied, progress, end, requeue) here; programs' lifecycle
    in daemon/core/programs.py; its workers' side in daemon/core/worker_health.py. The
    layers it drives (the KV loop, the SLO stack) see it as `daemon.state.Host`."""

    def __init__(self, config: Config, writer: BatchWriter, sessions: async_sessionmaker[Any],
                 clock: Callable[[], float] = time.time, link: WorkerLink | None = None,
                 ids: Callable[[str], str] = new_id) -> None:
        # Wall time and random ids in the daemon; in a replay (daemon/replay/) virtual time
        # and numbered ids, so that a run repeats exactly.
        self.clock = clock
        self.new_id = ids
        self.config = config
        self.writer = writer
        self.sessions = sessions
        # Workers over ZeroMQ; the replay's sim workers in process (daemon/replay/).
        self.broker: WorkerLink = link or Broker(config.broker_endpoint, self.on_worker_message)
        self.workers: dict[str, WorkerState] = {}
        self.programs: dict[str, ProgramState] = {}
        self.requests: dict[str, RequestState] = {}
        # sessions whose row this daemon stored or queued, the most recently used ones
        self._known_sessions: lru.Lru[str, bool] = lru.Lru(lru.SESSIONS_REMEMBERED)
        self._tasks: list[asyncio.Task[None]] = []
        self._accepting = True
        self._pumping = False
        self.worker_key = ""  # read at start: the file may be created then
        self.watch = ProgressWatch(config.request_stall_timeout_s,
                                   config.request_progress_timeout_s)
        self.tallies = ProtocolTallies()
        # The workflow runtime's global-controller loop
        # (daemon/runtime/global_controller.py) sets this.
        self.control: Any = None
        self.kv = KvControl(self, config.kv_policy,
                           KvConfig(force_resume_s=config.kv_force_resume_s), config.kv_options,
                           config.kv_residency)
        settings = parse_settings(config.slo)
        self.slo = SloControl(self, settings,
                              LlmCaller(self, settings.llm, config.meta_interval_s))
        # The one global waiting queue: ordered by the active ordering policy, plus the
        # requests whose program the KV policy holds (see pump).
        self.queue = self.slo.waiting
        self._layers = CoreLayers(self.requests, self.programs, self.workers, self.slo, self.kv)
        # Parts that follow program lifecycles (tools) subscribe here.
        self.on_program_end: list[Callable[[ProgramState], None]] = [
            lambda p: self.slo.tagging.forget(p.id)]
        self.on_program_waiting: list[Callable[[ProgramState], None]] = []
        # Called as a request ends, with its finish (None: it failed or was aborted).
        self.on_request_end: list[
            Callable[[RequestState, protocol.Finish | None], None]] = []
        self.lineage = Lineage(self)
        self.expiry = ProgramExpiry(self, self.clock)  # program_idle_timeout_s (core/expiry.py)
        self.counters: dict[str, float] = {
            "requests_total": 0, "requests_failed": 0, "failovers": 0,
            "prompt_tokens": 0, "generation_tokens": 0, "cached_tokens": 0,
        }
        # This daemon's /metrics (daemon/metrics.py): its own registry, so two daemons in
        # one process (tests) share nothing; parts such as the tool service add theirs.
        self.metrics = DaemonMetrics()
        self.request_metrics = RequestMetrics(self.metrics)
        self.metrics.add(lambda: core_families(self))
        self.metrics.add(lambda: slo_families(self.slo))
        self.metrics.add(self.tallies.families)
        if isinstance(self.broker, Broker):
            self.metrics.add(self.broker.families)

    # --- lifecycle -----------------------------------------------------------

    async def start(self) -> None:
        self.worker_key = ensure_worker_key(self.config.config_path)
        # CurveZMQ on network worker endpoints, keyed by the same file (daemon/workers/curve.py).
        self.broker.use_worker_key(self.worker_key)
        self.broker.start()
        self._tasks.append(asyncio.create_task(self._health_loop(), name="worker-health"))
        self._tasks.append(asyncio.create_task(self._kv_loop(), name="kv-control"))
        self._tasks.append(asyncio.create_task(self.slo.run(), name="slo-control"))

    async def stop(self) -> None:
        self._accepting = False
        for w in self.workers.values():
            if w.healthy:
                self.broker.send(w.identity, protocol.Shutdown())
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.broker.stop()

    # --- sessions and programs -------------------------------------------------









    # --- requests -------------------------------------------------------------

    def submit(
        self,
        program: ProgramState,
        kind: str,
        model: str,
        sampling: protocol.SamplingParams,
        prompt: str | None = None,
        messages: list[protocol.ChatMessage] | None = None,
        priority: int = 0,
        tools: protocol.Tools | None = None,
        prompt_token_ids: list[int] | None = None,
        segments: list[protocol.Segment] | None = None,
    ) -> RequestState:
        if not self._accepting:
            raise CoreError("the daemon is shutting down", status=503, code="unavailable")
        if program.active_request is not None:
            raise CoreError(
                f"program '{program.id}' already has a request running "
                f"('{program.active_request}'); a program issues one LLM call at a time",
                status=409, code="program_busy",
            )
        if prompt_token_ids is not None:
            refuse_unservable(len(prompt_token_ids), self.workers.values())
        now = self.clock()
        req = RequestState(
            id=self.new_id("req"), program_id=program.id, session_id=program.session_id, kind=kind,
            model=model, sampling=sampling, queued_at=now, prompt=prompt, messages=messages,
            priority=priority, tools=tools, prompt_token_ids=prompt_token_ids,
            segments=segments,
        )
        self.requests[req.id] = req
        program.active_request = req.id
        program.ready_request = req.id
        program.ready_since = now
        if program.acting_since is not None:
            program.tool_time_sum += now - program.acting_since
            program.tool_time_count += 1
        self.counters["requests_total"] += 1
        self.writer.insert("requests", _request_row(req))
        tag = self.slo.on_submit(req, now)
        self.writer.trace(
            "request.queued", session_id=req.session_id, program_id=req.program_id,
            request_id=req.id, max_tokens=sampling.max_tokens, **self.slo.describe(tag),
        )
        for callback in self.on_program_waiting:
            callback(program)
        self.pump()
        return req

    async def abort(self, request_id: str, reason: str = "client aborted") -> None:
        req = self.requests.get(request_id)
        if req is None or req.status not in (RequestStatus.QUEUED, RequestStatus.RUNNING):
            return
        if req.status == RequestStatus.RUNNING and req.worker_id in self.workers:
            worker = self.workers[req.worker_id]
            self.broker.send(worker.identity, protocol.Abort(request_id=req.id))
        self._end_request(req, RequestStatus.ABORTED, "abort", error=reason)

    def pump(self) -> None:
        """Dispatch what the KV policy places and the stability agent admits.

        The global waiting queue across workers has two parts. `parked` holds requests
        whose program the KV policy is holding (not admitted yet, paused, held by an
        operator); they are retried in arrival order on every pump, as before the SLO
        stack, since the KV policy decides when they run. The ordered part holds the
        rest in the active ordering policy's order and is served head first while the
        head's worker admits it. A head no open worker admits stops the pump: nothing
        overtakes it, which is what makes the order matter. A head whose program lives
        on one full worker waits aside for this pump so the other workers keep serving.
        """
        if self._pumping:
            return
        self._pumping = True
        self.kv.begin_step()
        try:
            decisions = dispatch(list(self.queue.parked), self.queue.ordered,
                                 self.slo.open_workers(), self._layers, self.clock())
            for decision in decisions:
                self._apply(decision)
                # A request parked stays as it was; anything else changed what the KV
                # policy sees (a program dispatched, a request refused).
                if not isinstance(decision, (Park, StillParked)):
                    self.kv.step_changed()
        finally:
            self.kv.end_step()
            self._pumping = False

    def _apply(self, decision: Decision) -> None:
        if isinstance(decision, StillParked):
            self.queue.parked = deque(decision.request_ids)
            return
        if isinstance(decision, Park):
            self.queue.parked.append(decision.request_id)
            return
        req = self.requests[decision.request_id]
        if isinstance(decision, Refuse):
            self.slo.refuse(req, decision.decision)
        else:
            self._dispatch(req, self.programs[req.program_id], self.workers[decision.worker])

    def _dispatch(self, req: RequestState, program: ProgramState, worker: WorkerState) -> None:
        frame = self._submit_frame(req)
        if frame is None:
            return
        now = self.clock()
        first_dispatch = req.dispatched_at is None
        req.status = RequestStatus.RUNNING
        req.worker_id = worker.id
        req.dispatched_at = req.dispatched_at or now
        worker.inflight.add(req.id)
        self.watch.dispatched(req.id, worker.id, now, req.output_tokens)
        self.broker.send_frame(worker.identity, frame, "Submit")
        program.worker_id = worker.id
        program.kv_node = worker.node
        program.ready_request = None
        program.ready_since = None
        self.set_program_status(program, ProgramStatus.REASONING, "request dispatched")
        self.writer.update(
            "requests", req.id, status=req.status.value, worker_id=worker.id,
            dispatched_at=req.dispatched_at,
        )
        if first_dispatch:
            self.request_metrics.dispatched(worker, now - req.queued_at)
        self.writer.trace(
            "request.dispatched", session_id=req.session_id, program_id=req.program_id,
            request_id=req.id, worker_id=worker.id, failover=not first_dispatch,
            **self.slo.on_dispatch(req, worker.id),
        )

    def _submit_frame(self, req: RequestState) -> bytes | None:
        """The request's Submit as sent, or None when it cannot be encoded. Encoded before
        the request is marked as sent, so one that cannot be fails alone: no worker holds
        it, waits on it or is suspected of stalling on it."""
        sampling = req.sampling
        if req.output_tokens:  # a failover: the rest of the budget, after the text so far
            remaining = max(1, sampling.max_tokens - req.output_tokens)
            sampling = protocol.SamplingParams(**{
                **{f: getattr(sampling, f) for f in sampling.__struct_fields__},
                "max_tokens": remaining,
            })
        try:
            return protocol.encode(protocol.Submit(
                request_id=req.id, program_id=req.program_id, prompt=req.prompt,
                messages=req.messages, continuation=req.text_so_far, sampling=sampling,
                priority=req.priority, tools=req.tools, prompt_token_ids=req.prompt_token_ids,
                segments=req.segments or [],
            ))
        except protocol.EncodeError as exc:
            log.warning("request %s of program %s cannot be sent: %s", req.id,
                        req.program_id, exc)
            self._end_request(req, RequestStatus.FAILED, "error",
                              error=f"the request cannot be sent to an engine: {exc}")
            return None

    # --- worker messages --------------------------------------------------------

    def _on_delta(self, worker: WorkerState, msg: protocol.TokenDelta) -> None:
        req = self.requests.get(msg.request_id)
        if req is None or req.status != RequestStatus.RUNNING or req.worker_id != worker.id:
            return
        now = self.clock()
        msg = self._checked(worker, "token delta",
                            clean_delta(msg, req.output_tokens, req.sampling.max_tokens))
        self.watch.progressed(req.id, now)
        if req.first_token_at is None and msg.num_tokens > 0:
            req.first_token_at = now
            self.request_metrics.first_token(worker, now - req.queued_at)
            self.writer.update("requests", req.id, first_token_at=now)
            self.writer.trace(
                "request.first_token", session_id=req.session_id, program_id=req.program_id,
                request_id=req.id, worker_id=worker.id,
            )
        if msg.prompt_tokens is not None and not req.prompt_tokens:
            req.prompt_tokens = msg.prompt_tokens
        if msg.cached_tokens is not None and req.failovers == 0:
            req.cached_tokens = msg.cached_tokens
            self.kv.request_hit(req)
        req.output_tokens += msg.num_tokens
        req.generated.append(msg.text)
        req.stream.put_nowait(StreamItem(text=msg.text, num_tokens=msg.num_tokens,
                                         message=msg.message, logprobs=msg.logprobs,
                                         token_ids=msg.token_ids))

    def _on_finish(self, worker: WorkerState, msg: protocol.Finish) -> None:
        worker.inflight.discard(msg.request_id)
        req = self.requests.get(msg.request_id)
        if req is None or req.status != RequestStatus.RUNNING or req.worker_id != worker.id:
            self.pump()
            return
        msg = self._checked(worker, "finish", clean_finish(
            msg, self.watch.tokens_this_dispatch(req.id, req.output_tokens)))
        if req.failovers == 0:
            req.prompt_tokens = msg.prompt_tokens
            req.cached_tokens = msg.cached_tokens
        req.prompt_tokens = req.prompt_tokens or msg.prompt_tokens
        # Deltas and finish may each be sane and still disagree (prompt from one, cached
        # from the other, or across a failover): usage must never show cached > prompt.
        req.cached_tokens = min(req.cached_tokens, req.prompt_tokens)
        self.kv.request_wrote(req)
        if msg.reason == "error":
            self._end_request(req, RequestStatus.FAILED, "error", error=msg.error or "engine error")
        else:
            final = protocol.Finish(
                request_id=req.id, reason=msg.reason, prompt_tokens=req.prompt_tokens,
                cached_tokens=req.cached_tokens, output_tokens=req.output_tokens,
                ttft_s=(req.first_token_at - req.queued_at) if req.first_token_at else None,
                reply=msg.reply, segment_token_ids=msg.segment_token_ids,
            )
            status = RequestStatus.ABORTED if msg.reason == "abort" else RequestStatus.FINISHED
            self._end_request(req, status, msg.reason, finish=final)
        self.pump()

    def _end_request(
        self, req: RequestState, status: RequestStatus, reason: str,
        error: str | None = None, finish: protocol.Finish | None = None,
    ) -> None:
        now = self.clock()
        req.status = status
        req.finished_at = now
        self.watch.forget(req.id)
        if req.worker_id in self.workers:
            self.workers[req.worker_id].inflight.discard(req.id)
        program = self.programs.get(req.program_id)
        if program is not None and program.active_request == req.id:
            program.active_request = None
            program.steps += 1
            program.context_tokens = req.prompt_tokens + req.output_tokens
            program.ready_request = None
            program.acting_since = now
            if program.status not in (ProgramStatus.STOPPED, ProgramStatus.FAILED):
                self.set_program_status(program, ProgramStatus.ACTING, "request ended")
                self.kv.request_ended(program)
        if status == RequestStatus.FINISHED:
            served_by = self.workers.get(req.worker_id or "")
            if served_by is not None:
                self.request_metrics.finished(served_by, req, reason, now)
            self.counters["prompt_tokens"] += req.prompt_tokens
            self.counters["generation_tokens"] += req.output_tokens
            self.counters["cached_tokens"] += req.cached_tokens
        elif status == RequestStatus.FAILED:
            self.counters["requests_failed"] += 1
        self.slo.on_end(req)
        self.writer.update(
            "requests", req.id, status=status.value, finish_reason=reason, error=error,
            prompt_tokens=req.prompt_tokens, cached_tokens=req.cached_tokens,
            output_tokens=req.output_tokens, finished_at=now, failovers=req.failovers,
        )
        kind = {"finished": "request.finished", "aborted": "request.aborted"}.get(
            status.value, "request.failed")
        self.writer.trace(
            kind, session_id=req.session_id, program_id=req.program_id, request_id=req.id,
            worker_id=req.worker_id, reason=reason, error=error,
            prompt_tokens=req.prompt_tokens, cached_tokens=req.cached_tokens,
            output_tokens=req.output_tokens,
        )
        for callback in self.on_request_end:
            callback(req, finish)
        req.stream.put_nowait(StreamItem(finish=finish, error=error if finish is None else None))
        # Finished requests are kept only until their consumer has read them.
        asyncio.get_running_loop().call_later(30.0, self.requests.pop, req.id, None)

    # --- health and failover ------------------------------------------------------

    async def _health_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.heartbeat_interval_s)
            self.health_tick()

    def health_tick(self) -> None:
        """Once per heartbeat interval: silent workers, queued requests with no worker,
        idle programs (the replay calls it at the same period in virtual time)."""
        now = self.clock()
        self.check_health(now)
        self._expire_queued(now)
        self.expiry.tick()

    async def _kv_loop(self) -> None:
        while True:
            await asyncio.sleep(self.kv.config.check_interval_s)
            self.kv.tick()

    def requeue(self, request_id: str, reason: str) -> None:
        """Take a running request off its worker and queue it again (operator moves)."""
        req = self.requests.get(request_id)
        if req is None or req.status != RequestStatus.RUNNING:
            return
        worker = self.workers.get(req.worker_id or "")
        if worker is not None:
            worker.inflight.discard(req.id)
            self.broker.send(worker.identity, protocol.Abort(request_id=req.id))
        self.writer.trace(
            "request.requeued", session_id=req.session_id, program_id=req.program_id,
            request_id=req.id, worker_id=req.worker_id, reason=reason,
            generated_tokens=req.output_tokens,
        )
        self._back_to_queue(req, reason)

    def _back_to_queue(self, req: RequestState, reason: str) -> None:
        """The request continues later, elsewhere, from the text generated so far."""
        req.status = RequestStatus.QUEUED
        self.watch.forget(req.id)
        self.slo.on_release(req)
        program = self.programs.get(req.program_id)
        if program is not None:
            program.ready_request = req.id
            program.ready_since = self.clock()
            self.set_program_status(program, ProgramStatus.PAUSED, reason)
        self.queue.parked.appendleft(req.id)

    def _expire_queued(self, now: float) -> None:
        if any(w.healthy for w in self.workers.values()):
            return
        limit = self.config.queue_timeout_s
        for rid in list(self.queue):
            req = self.requests.get(rid)
            if req and req.status == RequestStatus.QUEUED and now - req.queued_at > limit:
                self._end_request(req, RequestStatus.FAILED, "error",
                                  error=f"no healthy worker for {limit:.0f}s")


def _request_row(req: RequestState) -> dict[str, Any]:
    return {
        "id": req.id, "program_id": req.program_id, "session_id": req.session_id,
        "context_id": None, "kind": req.kind, "model": req.model, "status": req.status.value,
        "worker_id": None, "priority": req.priority, "max_tokens": req.sampling.max_tokens,
        "prompt_tokens": 0, "cached_tokens": 0, "output_tokens": 0, "finish_reason": None,
        "error": None, "failovers": 0, "queued_at": req.queued_at, "dispatched_at": None,
        "first_token_at": None, "finished_at": None,
    }
