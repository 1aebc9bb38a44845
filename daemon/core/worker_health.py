"""The core's side of its workers: registration (who may register, refusals counted),
heartbeats, the messages a worker sends, health (missed heartbeats, stalled requests) and
failover of a lost worker's requests. Mixed into `Core` (daemon/core/core.py), whose state
it uses; requests' own progress (deltas, finishes) stays in the core."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from daemon.config import Config
from daemon.state import RequestState, RequestStatus, WorkerState
from daemon.workers import protocol
from daemon.workers.broker import WorkerLink
from daemon.workers.counts import (
    ProtocolTallies,
    clean_residency,
    clean_stats,
    register_problem,
)
from daemon.workers.key import key_matches
from daemon.workers.watch import ProgressWatch, Stall
from db.writer import BatchWriter

log = logging.getLogger("agentd.core")


class WorkerHealth:
    """Core's worker handling; the attributes are Core's (set in its __init__)."""

    config: Config
    writer: BatchWriter
    clock: Callable[[], float]
    broker: WorkerLink
    workers: dict[str, WorkerState]
    requests: dict[str, RequestState]
    watch: ProgressWatch
    tallies: ProtocolTallies
    worker_key: str
    counters: dict[str, float]

    if TYPE_CHECKING:  # Core's, used here
        def pump(self) -> None: ...

        def _on_delta(self, worker: WorkerState, msg: protocol.TokenDelta) -> None: ...

        def _on_finish(self, worker: WorkerState, msg: protocol.Finish) -> None: ...

        def _end_request(self, req: RequestState, status: RequestStatus, reason: str,
                         error: str | None = None,
                         finish: protocol.Finish | None = None) -> None: ...

        def _back_to_queue(self, req: RequestState, reason: str) -> None: ...

    def on_worker_message(self, identity: bytes, msg: protocol.WorkerMessage) -> None:
        if isinstance(msg, protocol.Register):
            self._on_register(identity, msg)
            return
        worker = self.workers.get(identity.decode(errors="replace"))
        if worker is None or worker.identity != identity or worker.status == "gone":
            self.broker.send(identity, protocol.RegisterAck(
                accepted=False, message="unknown worker: register again"))
            return
        worker.last_seen = self.clock()
        if worker.status == "unhealthy":
            self._set_worker_status(worker, "healthy", "heartbeat resumed")
        if isinstance(msg, protocol.Heartbeat):
            worker.stats = self._checked(worker, "heartbeat", clean_stats(msg.stats))
            self.watch.engine_steps(worker.id, worker.stats.steps, worker.last_seen)
            if worker.kv_events and (msg.residency or msg.residency_dropped):
                worker.residency.update(self._checked(
                    worker, "heartbeat", clean_residency(msg.residency,
                                                         worker.kv_capacity_tokens)))
                for program_id in msg.residency_dropped:
                    worker.residency.pop(program_id, None)
        elif isinstance(msg, protocol.TokenDelta):
            self._on_delta(worker, msg)
        elif isinstance(msg, protocol.Finish):
            self._on_finish(worker, msg)

    def _refuse(self, identity: bytes, msg: protocol.Register, kind: str, reason: str) -> None:
        """Answer a refused registration; log and trace it once per socket identity, so
        a peer that keeps trying cannot flood the log or the store (all are counted)."""
        self.broker.send(identity, protocol.RegisterAck(accepted=False, message=reason))
        if self.tallies.refuse(identity, kind, time.monotonic()):
            worker_id = msg.worker_id[:64]  # chosen by whoever connected
            log.warning("refused worker %r: %s", worker_id, reason)
            self.writer.trace("worker.refused", worker_id=worker_id, reason=reason)

    def _registration_problem(self, identity: bytes, msg: protocol.Register
                              ) -> tuple[str, str] | None:
        """(kind, reason) when the registration must be refused."""
        if msg.schema_hash != protocol.SCHEMA_HASH:
            return "schema", (
                f"protocol schema mismatch: worker has {msg.schema_hash}, daemon has "
                f"{protocol.SCHEMA_HASH}; run the same agentd version on both"
            )
        if not key_matches(self.worker_key, msg.key):
            return "key", ("worker key missing or wrong: start the worker with --key-file "
                           "pointing to a copy of the daemon's worker.key")
        if identity.decode(errors="replace") != msg.worker_id:
            return "identity", "worker id must equal the socket identity"
        problem = register_problem(msg)
        return None if problem is None else ("sizes", problem)

    def _on_register(self, identity: bytes, msg: protocol.Register) -> None:
        refused = self._registration_problem(identity, msg)
        if refused is not None:
            self._refuse(identity, msg, *refused)
            return
        now = self.clock()
        old = self.workers.get(msg.worker_id)
        worker = WorkerState(
            id=msg.worker_id, identity=identity, engine=msg.engine, model=msg.model,
            kv_capacity_tokens=msg.kv_capacity_tokens, block_size=msg.block_size,
            max_batch=msg.max_batch, pid=msg.pid, host=msg.host, registered_at=now,
            last_seen=now, tools=msg.tools, kv_events=msg.kv_events, node=msg.node,
            dp_rank=msg.dp_rank,
        )
        self.workers[worker.id] = worker
        self.watch.registered(worker.id, now)
        self.broker.send(identity, protocol.RegisterAck(
            accepted=True, heartbeat_interval_s=self.config.heartbeat_interval_s))
        row = {
            "engine": msg.engine, "model": msg.model, "kv_capacity_tokens": msg.kv_capacity_tokens,
            "block_size": msg.block_size, "max_batch": msg.max_batch, "status": "healthy",
            "pid": msg.pid, "host": msg.host, "registered_at": now, "last_seen_at": now,
        }
        if old is None:
            self.writer.insert("workers", {"id": worker.id, **row})
        else:
            self.writer.update("workers", worker.id, **row)
        self.writer.trace(
            "worker.registered", worker_id=worker.id, engine=msg.engine, model=msg.model,
            kv_capacity_tokens=msg.kv_capacity_tokens, pid=msg.pid, node=msg.node,
            dp_rank=msg.dp_rank,
        )
        log.info("worker %s registered (%s, %s) on node %s", worker.id, msg.engine, msg.model,
                 msg.node)
        # Only after the ack: a restarted worker lost whatever its previous process ran.
        if old is not None and old.inflight:
            self._fail_over(old, "worker restarted")
        self.pump()

    def _checked(self, worker: WorkerState, what: str, cleaned: tuple[Any, list[str]]) -> Any:
        message, problems = cleaned
        if problems and self.tallies.bad(worker.id, what, problems):
            self.writer.trace("worker.bad_counts", worker_id=worker.id, message=what,
                              problems=problems)
        return message

    def check_health(self, now: float) -> None:
        for worker in list(self.workers.values()):
            silent = now - worker.last_seen
            if worker.status in ("healthy", "suspect") and silent > self.config.heartbeat_timeout_s:
                self._set_worker_status(worker, "unhealthy", f"no heartbeat for {silent:.1f}s")
                self._fail_over(worker, f"worker {worker.id} missed heartbeats")
            elif worker.status == "unhealthy" and silent > 10 * self.config.heartbeat_timeout_s:
                self._set_worker_status(worker, "gone", f"no heartbeat for {silent:.0f}s")
            elif worker.status == "suspect" and self.watch.probation_over(worker.id, now):
                self._set_worker_status(worker, "healthy", "probation: it gets requests again")
                self.pump()
        for worker_id, stalls in self.watch.stalled(now).items():
            self._on_stalled(worker_id, stalls, now)

    def _on_stalled(self, worker_id: str, stalls: list[Stall], now: float) -> None:
        """A live worker made no progress on these requests: they move on as a dead
        worker's would, and the worker gets no new requests for a while."""
        worker = self.workers.get(worker_id)
        held = worker.inflight if worker is not None else set()
        for stall in stalls:
            if stall.request_id not in held:  # left the worker some other way
                self.watch.forget(stall.request_id)
        ids = [s.request_id for s in stalls if s.request_id in held]
        if worker is None or not ids:
            return
        until = self.watch.suspect(worker.id, now)
        self.tallies.stalls[worker.id] += len(ids)
        reason = f"worker {worker.id} made no progress on the request: {stalls[0].reason}"
        if worker.status in ("healthy", "suspect"):
            self._set_worker_status(
                worker, "suspect", f"{len(ids)} request(s) stalled ({stalls[0].reason}); "
                f"no new requests for {until - now:.0f}s")
        for rid in ids:
            # Whatever the engine still does for them is wasted: the requests go elsewhere.
            self.broker.send(worker.identity, protocol.Abort(request_id=rid))
        self._fail_over(worker, reason, only=ids)

    def _set_worker_status(self, worker: WorkerState, status: str, reason: str) -> None:
        worker.status = status
        self.writer.update("workers", worker.id, status=status, last_seen_at=worker.last_seen)
        self.writer.trace(f"worker.{status}", worker_id=worker.id, reason=reason)
        log.warning("worker %s is %s: %s", worker.id, status, reason)

    def _fail_over(self, worker: WorkerState, reason: str, only: list[str] | None = None) -> None:
        """Requeue the worker's requests (those in `only`, else all: it is dead) at the
        head of the queue, oldest first."""
        ids = set(worker.inflight) if only is None else worker.inflight & set(only)
        stranded = sorted(
            (self.requests[r] for r in ids if r in self.requests),
            key=lambda r: r.queued_at, reverse=True,
        )
        worker.inflight -= ids
        has_other = any(w.healthy and w.id != worker.id for w in self.workers.values())
        for req in stranded:
            if req.status != RequestStatus.RUNNING:
                continue
            if not has_other:
                self._end_request(req, RequestStatus.FAILED, "error",
                                  error=f"{reason}; no healthy worker left to take the request")
                continue
            req.failovers += 1
            self.counters["failovers"] += 1
            self.writer.trace(
                "request.failover", session_id=req.session_id, program_id=req.program_id,
                request_id=req.id, worker_id=worker.id, reason=reason,
                generated_tokens=req.output_tokens,
            )
            self._back_to_queue(req, f"worker {worker.id} lost")
        self.pump()
