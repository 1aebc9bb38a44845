"""Virtual-time driver for the simulated engine, for trace replay and tests.

API::

    clock = VirtualClock()                       # now() == 0.0
    sched = SimScheduler(SchedulerConfig.from_capacity(65536), load_cost_model("llama3-8b-h100"))
    drv = VirtualDriver(sched, clock)
    drv.submit(SimRequest(request_id="r1", prompt_token_ids=ids, max_tokens=64))  # arrives now
    for ev in drv.run_until(12.5):               # the steps that started before 12.5
        ev.start, ev.end, ev.result.outputs      # StepResult of that step
    drv.run_until_idle()                         # until nothing is waiting or running
    drv.timings["r1"]                            # RequestTiming: arrival, first_token, finish...

Semantics: a step is atomic. It starts at ``clock.now()``, its outputs exist at
``start + duration_s``, and the clock is then at that end time, which may lie past the ``t`` given
to ``run_until`` (a real engine cannot interrupt a forward pass either). Requests submitted
between steps join the next step. When the scheduler has nothing to do, ``run_until`` jumps the
clock straight to ``t``. A replay harness interleaves ``run_until(next_arrival)`` with
``submit`` and can put several drivers (one per simulated worker) on one shared ``VirtualClock``
by always advancing the driver whose next step starts earliest (``next_step_at``).

Timings are in clock seconds: ``ttft`` = first output token time - arrival; they are complete
once ``finish`` is set (``finish_reason`` "length" | "stop" | "abort").
"""

from __future__ import annotations

from dataclasses import dataclass

from daemon.engines.sim.scheduler import SimRequest, SimScheduler, StepResult


class VirtualClock:
    def __init__(self, start: float = 0.0) -> None:
        self._now = start

    def now(self) -> float:
        return self._now

    def advance_to(self, t: float) -> None:
        if t > self._now:
            self._now = t


@dataclass(slots=True)
class RequestTiming:
    arrival: float
    prompt_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    first_token: float | None = None
    finish: float | None = None
    finish_reason: str | None = None
    preemptions: int = 0

    @property
    def ttft(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.arrival

    @property
    def e2e(self) -> float | None:
        return None if self.finish is None else self.finish - self.arrival

    @property
    def tpot(self) -> float | None:
        """Mean time per output token after the first."""
        if self.finish is None or self.first_token is None or self.output_tokens < 2:
            return None
        return (self.finish - self.first_token) / (self.output_tokens - 1)


@dataclass(frozen=True, slots=True)
class TimedStep:
    start: float
    end: float
    result: StepResult


class VirtualDriver:
    """Runs one ``SimScheduler`` against a ``VirtualClock``; never sleeps."""

    def __init__(self, scheduler: SimScheduler, clock: VirtualClock | None = None) -> None:
        self.scheduler = scheduler
        self.clock = clock or VirtualClock()
        self.timings: dict[str, RequestTiming] = {}
        self._busy_until = self.clock.now()

    def submit(self, request: SimRequest) -> None:
        """Add a request arriving at ``clock.now()``; raises ``RequestRejected`` if it can't run."""
        self.scheduler.add_request(request)
        self.timings[request.request_id] = RequestTiming(
            arrival=self.clock.now(), prompt_tokens=request.num_prompt_tokens
        )

    def abort(self, request_id: str) -> bool:
        req = self.scheduler.abort(request_id)
        if req is None:
            return False
        t = self.timings[request_id]
        t.finish, t.finish_reason = self.clock.now(), "abort"
        t.output_tokens, t.preemptions = req.num_output_tokens, req.num_preemptions
        return True

    def next_step_at(self) -> float | None:
        """When this driver's next step would start, or None if it is idle."""
        if not self.scheduler.has_work():
            return None
        return max(self.clock.now(), self._busy_until)

    def step(self) -> TimedStep | None:
        """Run one step from now (or when the previous one ends), advancing the clock past it."""
        start = self.next_step_at()
        if start is None:
            return None
        result = self.scheduler.step()
        end = start + result.duration_s
        self._busy_until = end
        self.clock.advance_to(end)
        for out in result.outputs:
            t = self.timings[out.request_id]
            t.cached_tokens = out.num_cached_tokens
            t.output_tokens = out.num_output_tokens
            if out.new_token_ids and t.first_token is None:
                t.first_token = end
            if out.finish_reason is not None:
                t.finish, t.finish_reason = end, out.finish_reason
        for rid in result.preempted:
            self.timings[rid].preemptions += 1
        return TimedStep(start, end, result)

    def run_until(self, t: float) -> list[TimedStep]:
        """Run the steps that start before ``t``; then, if idle, jump the clock to ``t``."""
        steps = self._run(t)
        if not self.scheduler.has_work():
            self.clock.advance_to(t)
        return steps

    def run_until_idle(self) -> list[TimedStep]:
        """Run until nothing is waiting or running; the clock stays at the last step's end."""
        return self._run(float("inf"))

    def _run(self, t: float) -> list[TimedStep]:
        steps: list[TimedStep] = []
        while (start := self.next_step_at()) is not None and start < t:
            step = self.step()
            assert step is not None
            if not step.result.outputs:
                # Unreachable while max_model_len <= KV capacity; fail loudly, not spin forever.
                raise RuntimeError("simulated scheduler has work but scheduled nothing")
            steps.append(step)
        return steps
