"""The frozen snapshot the KV layer decides on.

The daemon builds one `KvView` per decision step from its program table and the
workers' last reports; nothing here is mutated, so a policy can be replayed on a
recorded view and get the same answer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from functools import cached_property


class ProgramStatus(Enum):
    QUEUED = "queued"  # arrived, never admitted to a worker
    REASONING = "reasoning"  # a request is running on its worker
    ACTING = "acting"  # admitted, between requests (a tool is running)
    PAUSED = "paused"  # not admitted; its KV may have been evicted
    STOPPED = "stopped"  # released


WAITING = frozenset({ProgramStatus.QUEUED, ProgramStatus.PAUSED})
RESIDENT = frozenset({ProgramStatus.REASONING, ProgramStatus.ACTING})


@dataclass(frozen=True)
class WorkerView:
    worker_id: str
    capacity_tokens: int
    used_tokens: int = 0
    healthy: bool = True
    node: str = ""  # the machine it runs on; "" = unknown (one node, as before nodes)


@dataclass(frozen=True)
class ProgramView:
    """One program as the scheduler sees it.

    `worker_id` is the worker a resident program runs on; for a PAUSED program it
    is the worker it last ran on (kept for locality), for QUEUED it is None.
    `ready_since` is when the pending request became ready and started waiting for
    admission: the force-resume clock runs from it, so a program paused while its
    tool runs does not count tool time as waiting time.

    `acting_since` is when its last request ended, or, when agentd itself runs the
    program's tool, when that tool started. The `tool_*` fields are known only for
    tools agentd runs: `tool_running` while one runs; `tool_ended_at` once the tool of
    this acting period ended (its next request is due); `tool_last_s` the last tool's
    measured duration. `tool_time_mean_s` is the mean of measured tool durations when
    there are any, else of the gaps between the program's requests.

    `kv_resident` says whether a PAUSED program's blocks are still cached on
    `worker_id`: True or False when the daemon knows it (from the engine's KV cache
    events, all but at most one block of its last context cached) or estimates it
    (scheduling/kv/residency.py, for an engine without events), None when it does not.
    Policies act on it only when it is known: a preference (go home, restore first, no
    recompute) needs True, a demotion (rank with new programs) needs False, so an unknown
    residency gets the issue's plain order. `kv_cached_tokens` is how much of its context
    is cached there, in the engine's cache or a host tier it restores from without
    recompute, when the events say (None otherwise).
    """

    program_id: str
    status: ProgramStatus
    context_tokens: int
    created_at: float
    worker_id: str | None = None
    acting_since: float | None = None
    ready_since: float | None = None
    pending_request: bool = False
    pinned: bool = False
    pause_marked: bool = False
    tool_time_mean_s: float | None = None  # mean of this program's past tool calls
    prefix_group: str | None = None  # programs sharing a prompt prefix
    prefix_tokens: int = 0  # length of that shared prefix
    kv_resident: bool | None = None  # a PAUSED program's blocks cached on worker_id
    kv_cached_tokens: int | None = None  # leading tokens of it cached there, from events
    migrate_to: str | None = None  # restore_on of its MarkPauseAfterRequest, if any
    kv_node: str | None = None  # the node its KV was built on (its last request's worker's)
    tool_running: bool = False
    tool_last_s: float | None = None
    tool_ended_at: float | None = None

    def recompute_at_home(self) -> int | None:
        """Tokens it must prefill again on its own worker, when known: none while cached,
        the uncached rest when the events say how much is cached."""
        if self.kv_cached_tokens is not None:
            return max(0, self.context_tokens - self.kv_cached_tokens)
        return 0 if self.kv_resident is True else None

    @property
    def waited_from(self) -> float:
        return self.created_at if self.ready_since is None else self.ready_since

    @cached_property  # read for every live program by every plan; a view never changes
    def waiting(self) -> bool:
        """Has a request that needs admission before it can run."""
        return self.status is ProgramStatus.QUEUED or (
            self.status is ProgramStatus.PAUSED and self.pending_request
        )


@dataclass(frozen=True)
class KvConfig:
    """Knobs shared by the built-in policies.

    The paper sets both watermarks to 1 (the shared system prompt leaves slack);
    `low_watermark < high_watermark` opens a hysteresis window against flapping.

    `force_resume_s` bounds how long a ready request waits for admission (the
    paper has no such bound). It is a trade: when more programs want KV than fits
    and each holds it for minutes, a bound shorter than a program's lifetime forces
    rotation, and every forced turn recomputes a context. ThunderAgent places an
    overdue program at once; agentd scales the bound with the queue
    (scheduling/kv/fairness.py).
    """

    check_interval_s: float = 0.3
    decay_lambda: float = 0.1  # per second of acting time
    high_watermark: float = 1.0
    low_watermark: float = 1.0
    force_resume_s: float = 30.0
    default_tool_time_s: float = 2.0  # continuum TTL before any tool was observed


@dataclass(frozen=True)
class KvView:
    workers: tuple[WorkerView, ...]
    programs: tuple[ProgramView, ...]
    config: KvConfig = field(default_factory=KvConfig)

    def program(self, program_id: str) -> ProgramView:
        # Newest last (the daemon's programs in creation order), and a policy is asked most
        # about the newest: from the end, a new program is found at once instead of after
        # every live one. A view holds each program once, so the order finds the same one.
        for program in reversed(self.programs):
            if program.program_id == program_id:
                return program
        raise KeyError(program_id)

    def worker(self, worker_id: str) -> WorkerView | None:
        return next((w for w in self.workers if w.worker_id == worker_id), None)

    def crosses_node(self, program: ProgramView, worker_id: str) -> bool:
        """Whether running `program` on `worker_id` moves it off the node its KV is on.
        KV never travels between nodes (no cache, no prefix group, no host tier reaches
        across), so such a move recomputes the whole context. Unknown nodes do not cross."""
        worker = self.worker(worker_id)
        if worker is None or not worker.node or not program.kv_node:
            return False
        return worker.node != program.kv_node

    def home_worker(self, program: ProgramView) -> str | None:
        """The program's (last) worker if it is still healthy."""
        worker = self.worker(program.worker_id) if program.worker_id else None
        return worker.worker_id if worker and worker.healthy else None

    def healthy_workers(self) -> tuple[WorkerView, ...]:
        return tuple(w for w in self.workers if w.healthy)

    def on_worker(self, worker_id: str) -> tuple[ProgramView, ...]:
        return tuple(
            p for p in self.programs if p.worker_id == worker_id and p.status in RESIDENT
        )
