"""KV policies driven by a tiny event model: programs arrive, run requests, run
tools and are released, while the model applies every decision the policy returns."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from statistics import mean

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduling.kv import (
    KV_POLICIES,
    AgentdOptions,
    AgentdPolicy,
    Decision,
    KvConfig,
    KvPolicy,
    KvView,
    MarkPauseAfterRequest,
    Pause,
    ProgramStatus,
    ProgramView,
    WorkerView,
    make_kv_policy,
)

S = ProgramStatus
CAPACITY = 1000


@dataclass
class Prog:
    pid: str
    tokens: int
    created_at: float
    status: ProgramStatus = S.QUEUED
    worker: str | None = None
    acting_since: float | None = None
    ready_since: float | None = None
    pending: bool = True
    marked: bool = False
    tool_times: list[float] = field(default_factory=list)

    def view(self) -> ProgramView:
        return ProgramView(
            self.pid, self.status, self.tokens, self.created_at, worker_id=self.worker,
            acting_since=self.acting_since, ready_since=self.ready_since,
            pending_request=self.pending, pause_marked=self.marked,
            tool_time_mean_s=mean(self.tool_times) if self.tool_times else None,
        )


class Model:
    """Applies decisions the way the daemon does; tracks what each tick placed."""

    def __init__(self, policy: KvPolicy, workers: int = 2, **cfg: float) -> None:
        self.policy = policy
        self.workers = [f"w{i}" for i in range(workers)]
        self.config = KvConfig(**cfg)
        self.programs: dict[str, Prog] = {}
        self.now = 0.0
        self.placed: set[str] = set()
        self.reasons: list[str] = []

    def view(self) -> KvView:
        live = [p for p in self.programs.values() if p.status is not S.STOPPED]
        used = {w: sum(p.tokens for p in live if p.worker == w and p.status in
                       (S.REASONING, S.ACTING)) for w in self.workers}
        workers = tuple(WorkerView(w, CAPACITY, used[w]) for w in self.workers)
        return KvView(workers, tuple(p.view() for p in live), self.config)

    def apply(self, decisions: list[Decision]) -> None:
        for d in decisions:
            self.reasons.append(d.reason)
            p = self.programs[d.program_id]
            if isinstance(d, Pause):
                p.status, p.marked = S.PAUSED, False
            elif isinstance(d, MarkPauseAfterRequest):
                p.marked = True
            else:
                self._bind(p, d.worker_id)

    def _bind(self, p: Prog, worker: str) -> None:
        p.worker = worker
        self.placed.add(p.pid)
        if p.pending:
            p.status, p.pending = S.REASONING, False
        else:
            p.status = S.ACTING

    def arrive(self, tokens: int) -> None:
        pid = f"p{len(self.programs)}"
        self.programs[pid] = Prog(pid, tokens, self.now, ready_since=self.now)
        self._dispatch(self.programs[pid])

    def _dispatch(self, p: Prog) -> None:
        worker = self.policy.route(self.view(), p.pid, self.now)
        if worker is not None:
            self._bind(p, worker)

    def request_end(self, p: Prog, growth: int) -> None:
        p.status, p.acting_since = S.ACTING, self.now
        p.tokens = min(CAPACITY, p.tokens + growth)
        self.apply(self.policy.on_request_end(self.view(), p.pid, self.now))

    def tool_end(self, p: Prog) -> None:
        assert p.acting_since is not None
        p.tool_times.append(self.now - p.acting_since)
        p.pending, p.ready_since = True, self.now
        self._dispatch(p)

    def release(self, p: Prog) -> None:
        p.status, p.worker = S.STOPPED, None

    def tick(self, dt: float) -> None:
        self.now += dt
        self.placed = set()
        self.apply(self.policy.decide(self.view(), self.now))

    def admitted_tokens(self, worker: str) -> int:
        """REASONING tokens not already marked for pause, plus what this tick placed."""
        return sum(
            p.tokens for p in self.programs.values() if p.worker == worker and (
                (p.status is S.REASONING and not p.marked)
                or (p.pid in self.placed and p.status is S.ACTING))
        )

    def waiting(self) -> list[Prog]:
        return [p for p in self.programs.values()
                if p.status is S.QUEUED or (p.status is S.PAUSED and p.pending)]


def step(model: Model, kind: str, index: int, value: int) -> None:
    """One event; events that do not fit the chosen program's state are skipped."""
    progs = list(model.programs.values())
    p = progs[index % len(progs)] if progs else None
    if kind == "arrive":
        model.arrive(value)
    elif kind == "tick":
        model.tick(value / 10)
    elif p is None:
        return
    elif kind == "request_end" and p.status is S.REASONING:
        model.request_end(p, value // 4)
    elif kind == "tool_end" and not p.pending and p.status in (S.ACTING, S.PAUSED):
        model.tool_end(p)
    elif kind == "release" and not p.pending and p.status in (S.ACTING, S.PAUSED):
        model.release(p)


def drain(model: Model) -> None:
    """Finish every request and release every program, ticking until done."""
    for _ in range(200):
        for p in list(model.programs.values()):
            if p.status is S.REASONING:
                model.request_end(p, 0)
            elif p.status in (S.ACTING, S.PAUSED) and not p.pending:
                model.release(p)
        if all(p.status is S.STOPPED for p in model.programs.values()):
            return
        model.tick(1.0)


EVENTS = st.lists(
    # Releases are rare so that load builds up and workers overflow between checks.
    st.tuples(st.sampled_from(["arrive", "arrive", "tick", "tick", "request_end",
                               "request_end", "tool_end", "tool_end", "release"]),
              st.integers(0, 50), st.integers(1, 600)),
    min_size=10, max_size=120,
)


@pytest.mark.parametrize("name", ["thunderagent", "agentd"])
@settings(max_examples=60, deadline=None)
@given(events=EVENTS)
def test_admitted_tokens_fit_capacity_after_every_check(name: str,
                                                        events: list[tuple[str, int, int]]) -> None:
    model = Model(make_kv_policy(name), decay_lambda=0.3, force_resume_s=4.0)
    for kind, index, value in events:
        step(model, kind, index, value)
        if kind == "tick":
            for worker in model.workers:
                assert model.admitted_tokens(worker) <= CAPACITY


@pytest.mark.parametrize("name", sorted(KV_POLICIES))
@settings(max_examples=30, deadline=None)
@given(events=EVENTS)
def test_releasing_everything_stops_every_program(name: str,
                                                  events: list[tuple[str, int, int]]) -> None:
    model = Model(make_kv_policy(name))
    for kind, index, value in events:
        step(model, kind, index, value)
    drain(model)
    assert all(p.status is S.STOPPED for p in model.programs.values())
    assert not any(d.pause_marked for d in model.view().programs)


def run_busy(model: Model, seed: int, on_tick: Callable[[Model], None]) -> None:
    """Arrivals outpace releases on one worker, so programs must wait for room."""
    rng = random.Random(seed)
    for _ in range(600):
        if rng.random() < 0.1:
            model.arrive(rng.randint(50, 400))
        for p in list(model.programs.values()):
            if p.status is S.REASONING and rng.random() < 0.5:
                model.request_end(p, rng.randint(0, 40))
            elif p.status in (S.ACTING, S.PAUSED) and not p.pending and rng.random() < 0.02:
                model.release(p) if rng.random() < 0.3 else model.tool_end(p)
        model.tick(0.3)
        on_tick(model)


def test_no_request_waits_past_the_force_resume_timeout() -> None:
    # Almost no decay: tool-waiting programs keep their room, so newcomers get in
    # only through force-resume.
    model = Model(make_kv_policy("thunderagent"), workers=1, decay_lambda=1e-4,
                  force_resume_s=5.0)

    def check(m: Model) -> None:
        for p in m.waiting():
            assert p.ready_since is not None
            assert m.now - p.ready_since <= 5.0 + 0.3

    run_busy(model, 7, check)
    assert "force-resume" in model.reasons


@pytest.mark.parametrize("seed", [7, 8, 9])
def test_agentd_wait_is_bounded_by_the_timeout_per_waiting_program(seed: int) -> None:
    # An endless hold: programs between requests keep their room, so a waiting program
    # gets in only when one is released or through a swap.
    policy = AgentdPolicy(AgentdOptions(hold_s=1e9))
    model = Model(policy, workers=1, force_resume_s=5.0)
    most_waiting: dict[tuple[str, float], int] = {}

    def check(m: Model) -> None:
        waiting = m.waiting()
        for p in waiting:
            assert p.ready_since is not None
            key = (p.pid, p.ready_since)
            most_waiting[key] = max(most_waiting.get(key, 0), len(waiting))
            assert m.now - p.ready_since <= 5.0 * most_waiting[key] + 0.3

    run_busy(model, seed, check)
    assert "swap" in model.reasons
    assert max(most_waiting.values()) > 5  # the bound was more than the plain timeout
