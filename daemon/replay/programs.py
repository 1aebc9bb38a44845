"""Per-program replay state, and the ``ProgramView`` the KV policies see of it."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from daemon.engines.sim import SimRequest
from daemon.engines.sim.blocks import ROOT_HASH, block_hash
from daemon.replay.workload import ProgramSpec, first_prompt, next_prompt
from scheduling.kv import ProgramStatus, ProgramView


def extend_hashes(hashes: list[int], tokens: list[int], block_size: int) -> list[int]:
    """Chained block hashes of every full block of ``tokens``, reusing ``hashes`` as a
    valid prefix; identical to what the sim computes, so it never hashes a block twice."""
    out = list(hashes)
    parent = out[-1] if out else ROOT_HASH
    for i in range(len(out), len(tokens) // block_size):
        parent = block_hash(parent, tokens[i * block_size : (i + 1) * block_size])
        out.append(parent)
    return out


@dataclass(eq=False)
class ProgramRun:
    spec: ProgramSpec
    status: ProgramStatus = ProgramStatus.QUEUED
    index: int = 0  # the step being prepared, run or waited for
    worker: str | None = None
    context: list[int] = field(default_factory=list)
    hashes: list[int] = field(default_factory=list)
    prompt: list[int] = field(default_factory=list)
    prompt_hashes: list[int] = field(default_factory=list)
    request: SimRequest | None = None
    pending: bool = False
    ready_since: float | None = None
    acting_since: float | None = None
    started_at: float | None = None
    finished_at: float | None = None
    pause_marked: bool = False
    migrate_to: str | None = None
    tool_times: list[float] = field(default_factory=list)
    _view: tuple[tuple[int, int, int, bool | None], ProgramView] | None = field(
        default=None, repr=False)

    @property
    def pid(self) -> str:
        return self.spec.program_id

    @property
    def live(self) -> bool:
        return self.started_at is not None and self.status is not ProgramStatus.STOPPED

    def prepare(self, block_size: int) -> None:
        """Build the prompt of step ``index`` from the context the sim really produced."""
        if self.index == 0:
            self.prompt, shared = first_prompt(self.spec), 0
        else:
            self.prompt, shared = next_prompt(self.spec, self.index, self.context)
        self.prompt_hashes = extend_hashes(self.hashes[: shared // block_size], self.prompt,
                                           block_size)

    def make_request(self) -> SimRequest:
        step = self.spec.steps[self.index]
        # The sim owns the hash list from here on (it appends the output's blocks).
        return SimRequest(request_id=f"{self.pid}#{self.index}", prompt_token_ids=self.prompt,
                          max_tokens=step.output_tokens,
                          block_hashes=list(self.prompt_hashes))

    def context_tokens(self) -> int:
        if self.request is not None:
            return self.request.num_tokens
        return len(self.prompt) if self.pending else len(self.context)

    def __setattr__(self, name: str, value: object) -> None:
        # Counts assignments, so the view cache knows when a field may have changed.
        object.__setattr__(self, name, value)
        if name != "_view":
            object.__setattr__(self, "_edits", self.__dict__.get("_edits", 0) + 1)

    def view(self, kv_resident: bool | None) -> ProgramView:
        # Every routing call views every live program, and most have not changed since the
        # last one: reuse the frozen view until a field is assigned, the tool history grows,
        # the running request gains a token or residency flips.
        req = self.request
        key = (self.__dict__["_edits"], len(self.tool_times),
               -1 if req is None else req.num_tokens, kv_resident)
        if self._view is None or self._view[0] != key:
            self._view = (key, self._build_view(kv_resident))
        return self._view[1]

    def _build_view(self, kv_resident: bool | None) -> ProgramView:
        return ProgramView(
            program_id=self.pid,
            status=self.status,
            context_tokens=self.context_tokens(),
            created_at=self.started_at or 0.0,
            worker_id=self.worker,
            acting_since=self.acting_since,
            ready_since=self.ready_since if self.pending else None,
            pending_request=self.pending,
            pause_marked=self.pause_marked,
            tool_time_mean_s=statistics.fmean(self.tool_times) if self.tool_times else None,
            prefix_group=self.spec.prefix_group,
            prefix_tokens=self.spec.prefix_tokens,
            kv_resident=kv_resident,
            migrate_to=self.migrate_to,
        )
