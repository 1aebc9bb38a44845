"""One simulated worker in a replay: a ``VirtualDriver`` plus the bookkeeping the replay
needs to run several of them side by side.

Each worker keeps its own ``VirtualClock``: ``VirtualDriver.step`` moves its clock to the
step's end, so with one clock shared by all drivers a step on one worker would push every
other worker's next step past it, and N workers would run one after another instead of in
parallel. The replay's clock is the single source of time; a worker's clock is moved up
to it before each step, and a step runs when the replay's time reaches its start.
"""

from __future__ import annotations

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

    @property
    def used_fraction(self) -> float:
        pool = self.scheduler.kv.pool
        return pool.num_used / pool.num_blocks

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
        # Arrival and first-token times are kept by the replay: this driver's clock may
        # already stand at the end of a step that is still in flight in replay time.
        self.driver.submit(request)
