"""The replay's engine workers: simulated workers in this process, linked to the daemon's
core by the same messages the ZeroMQ broker carries (Register, Submit, Abort, Heartbeat,
TokenDelta, Finish), with no sockets and no clock of their own.

The core sends as it does to any worker (`WorkerLink`); a Submit becomes a request in the
worker's simulated scheduler. The replay's event loop runs each worker's steps in virtual
time (`next_step_at`, `start_step`, `end_step`) and calls `step_done` at a step's end,
which answers the core as a worker would: a first delta with the prompt and cached counts,
progress deltas (coalesced per heartbeat, as a worker may batch them: one message per token
would cost the replay most of its time and tell the scheduler nothing more), and a Finish.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from daemon.engines.sim import CostModel, SchedulerConfig, SimRequest, TimedStep
from daemon.engines.sim.blocks import ROOT_HASH, block_hash
from daemon.engines.sim.engine import request_from_submit
from daemon.engines.sim.scheduler import RequestRejected
from daemon.replay.worker import SimWorker
from daemon.workers import protocol

Deliver = Callable[[bytes, protocol.WorkerMessage], None]


@dataclass(slots=True)
class _Running:
    request: SimRequest
    program_id: str
    worker: bytes
    started: bool = False  # its first token was reported
    unreported: int = 0  # tokens generated since the last delta


class ReplayWorkers:
    """`WorkerLink` for the core, and the sim workers behind it."""

    endpoint = "inproc://replay"

    def __init__(self, count: int, sched: SchedulerConfig, cost: CostModel, model: str,
                 key: str) -> None:
        self.workers = {f"w{i}": SimWorker(f"w{i}", sched, cost) for i in range(count)}
        self.model, self.key = model, key
        self.deliver: Deliver = lambda identity, message: None
        self._running: dict[str, _Running] = {}
        # The last context each program's request left behind, and its block hashes:
        # the next prompt usually extends it, so only the new blocks are hashed.
        self._contexts: dict[str, tuple[list[int], list[int]]] = {}
        self.finished: dict[str, SimRequest] = {}  # until the replay reads it
        # Blocks any worker ever held, for what an unlimited prefix cache would have hit.
        self.seen_blocks: set[int] = set()
        self.ideal_cached: dict[str, int] = {}  # until the replay reads it
        self.preemptions: dict[str, int] = {}  # recompute preemptions, per request

    # --- WorkerLink -------------------------------------------------------------------

    def use_worker_key(self, key: str, *, encrypt_ipc: bool = False) -> None:
        self.key = key

    def start(self) -> None:
        pass  # nothing to bind: the workers are in this process

    async def stop(self) -> None:
        pass

    def send(self, identity: bytes, message: protocol.DaemonMessage) -> None:
        worker = identity.decode()
        if isinstance(message, protocol.Submit):
            self._submit(worker, message)
        elif isinstance(message, protocol.Abort):
            self._abort(worker, message.request_id)
        # RegisterAck and Shutdown need no answer from a simulated worker.

    def send_frame(self, identity: bytes, frame: bytes, what: str) -> None:
        self.send(identity, protocol.decode_from_daemon(frame))

    # --- the workers' side ------------------------------------------------------------

    def register_all(self) -> None:
        for worker_id, w in self.workers.items():
            cfg = w.scheduler.config
            self.deliver(worker_id.encode(), protocol.Register(
                worker_id=worker_id, engine="sim", model=self.model,
                kv_capacity_tokens=cfg.kv_capacity_tokens, block_size=cfg.block_size,
                max_batch=cfg.max_num_seqs, schema_hash=protocol.SCHEMA_HASH, key=self.key,
                host="replay", kv_events=True))

    def heartbeat(self) -> None:
        """Every worker's progress deltas, then its stats and the residency its cache's
        events gave, as a worker's heartbeat tick."""
        for rid, run in self._running.items():
            if run.started and run.unreported:
                self._delta(run, rid, run.unreported)
        for worker_id, w in self.workers.items():
            residency, dropped = w.scheduler.residency.take_report()
            self.deliver(worker_id.encode(), protocol.Heartbeat(
                worker_id=worker_id, stats=w.scheduler.stats(), residency=residency,
                residency_dropped=dropped))

    def step_done(self, worker_id: str, step: TimedStep) -> None:
        self.workers[worker_id].end_step()
        identity = worker_id.encode()
        for rid in step.result.preempted:
            self.preemptions[rid] = self.preemptions.get(rid, 0) + 1
        for out in step.result.outputs:
            run = self._running.get(out.request_id)
            if run is None:
                continue
            if out.new_token_ids:
                if not run.started:
                    run.started = True
                    self.deliver(identity, protocol.TokenDelta(
                        request_id=out.request_id, text="", num_tokens=len(out.new_token_ids),
                        prompt_tokens=out.num_prompt_tokens,
                        cached_tokens=out.num_cached_tokens))
                else:
                    run.unreported += len(out.new_token_ids)
            if out.finish_reason is not None:
                self._finish(identity, out.request_id, run, out.finish_reason,
                             out.num_cached_tokens)

    def steps_due(self, now: float) -> Iterator[tuple[float, str]]:
        for worker_id, w in self.workers.items():
            at = w.next_step_at(now)
            if at is not None:
                yield at, worker_id

    # --- internals --------------------------------------------------------------------

    def _submit(self, worker_id: str, submit: protocol.Submit) -> None:
        req = request_from_submit(submit)
        block_size = self.workers[worker_id].scheduler.config.block_size
        req.block_hashes = self._hashes(submit.program_id, req.prompt_token_ids, block_size)
        if submit.request_id not in self.ideal_cached:  # a failover's resubmit keeps the first
            limit = (len(req.prompt_token_ids) - 1) // block_size
            hits = next((i for i, h in enumerate(req.block_hashes[:limit])
                         if h not in self.seen_blocks), limit)
            self.ideal_cached[submit.request_id] = hits * block_size
        try:
            self.workers[worker_id].submit(req)
        except RequestRejected as exc:  # as the engine answers it: the request fails alone
            self.deliver(worker_id.encode(), protocol.Finish(
                request_id=submit.request_id, reason="error",
                prompt_tokens=req.num_prompt_tokens, cached_tokens=0, output_tokens=0,
                error=str(exc)))
            return
        self._running[submit.request_id] = _Running(req, submit.program_id, worker_id.encode())

    def _abort(self, worker_id: str, request_id: str) -> None:
        run = self._running.get(request_id)
        if run is None:
            return
        self.workers[worker_id].scheduler.abort(request_id)
        self._finish(worker_id.encode(), request_id, run, "abort",
                     max(run.request.num_cached_tokens, 0))

    def _finish(self, identity: bytes, rid: str, run: _Running, reason: str,
                cached: int) -> None:
        del self._running[rid]
        req = run.request
        if run.unreported:
            self._delta(run, rid, run.unreported)
        self._contexts[run.program_id] = (req.all_token_ids, req.block_hashes)
        self.seen_blocks.update(req.block_hashes)
        self.finished[rid] = req
        self.deliver(identity, protocol.Finish(
            request_id=rid, reason=reason, prompt_tokens=req.num_prompt_tokens,
            cached_tokens=max(cached, 0), output_tokens=req.num_output_tokens))

    def _delta(self, run: _Running, rid: str, tokens: int) -> None:
        run.unreported = 0
        self.deliver(run.worker, protocol.TokenDelta(request_id=rid, text="", num_tokens=tokens))

    def _hashes(self, program_id: str, tokens: list[int], block_size: int) -> list[int]:
        """Block hashes of `tokens`, reusing the program's last context where it agrees."""
        context, hashes = self._contexts.get(program_id, ([], []))
        same = 0
        for i in range(min(len(hashes), len(tokens) // block_size)):
            lo = i * block_size
            if context[lo:lo + block_size] != tokens[lo:lo + block_size]:
                break
            same = i + 1
        out = hashes[:same]
        parent = out[-1] if out else ROOT_HASH
        for i in range(same, len(tokens) // block_size):
            parent = block_hash(parent, tokens[i * block_size:(i + 1) * block_size])
            out.append(parent)
        return out
