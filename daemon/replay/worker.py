"""One simulated worker in a replay: a ``VirtualDriver`` plus the bookkeeping the harness
needs to run several of them side by side.

Each worker keeps its own ``VirtualClock``: ``VirtualDriver.step`` moves its clock to the
step's end, so with one clock shared by all drivers a step on one worker would push every
other worker's next step past it, and N workers would run one after another instead of in
parallel. The harness's clock is the single source of time; a worker's clock is moved up
to it before each step, and a step runs when the harness's time reaches its start.
"""

from __future__ import annotations

from dataclasses import replace

from daemon.engines.sim import (
    CostModel,
    SchedulerConfig,
    SimRequest,
    SimScheduler,
    TimedStep,
    VirtualClock,
    VirtualDriver,
)


class SimWorker:
    def __init__(self, worker_id: str, config: SchedulerConfig, cost: CostModel) -> None:
        self.worker_id = worker_id
        self.scheduler = SimScheduler(config, cost)
        self.driver = VirtualDriver(self.scheduler, VirtualClock())
        self.busy_until = 0.0
        self.in_step = False
        self.prefill_tokens = 0
        self.base_batched_tokens = config.max_num_batched_tokens

    @property
    def capacity_tokens(self) -> int:
        return self.scheduler.config.kv_capacity_tokens

    @property
    def used_tokens(self) -> int:
        return self.scheduler.kv.pool.num_used * self.scheduler.config.block_size

    @property
    def used_fraction(self) -> float:
        pool = self.scheduler.kv.pool
        return pool.num_used / pool.num_blocks

    def inflight(self) -> int:
        return len(self.scheduler.requests)

    def next_step_at(self, now: float) -> float | None:
        if self.in_step or not self.scheduler.has_work():
            return None
        return max(now, self.busy_until)

    def start_step(self, now: float) -> TimedStep:
        """Run one step starting at ``now``; its outputs belong to ``end_step`` at its end."""
        self.driver.clock.advance_to(now)
        step = self.driver.step()
        assert step is not None
        self.busy_until, self.in_step = step.end, True
        self.prefill_tokens += step.result.num_prefill_tokens
        return step

    def end_step(self) -> None:
        self.in_step = False

    def submit(self, request: SimRequest) -> None:
        # Arrival and first-token times are kept by the harness: this driver's clock may
        # already stand at the end of a step that is still in flight in harness time.
        self.driver.submit(request)

    def is_cached(self, block_hash: int) -> bool:
        return block_hash in self.scheduler.kv.pool.cached

    def set_token_budget(self, tokens: int) -> None:
        """The stability agent's B_token; the sim reads its config every step."""
        cfg = self.scheduler.config
        if tokens != cfg.max_num_batched_tokens:
            self.scheduler.config = replace(cfg, max_num_batched_tokens=max(16, tokens))
