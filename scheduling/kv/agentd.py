"""agentd's own KV policy: ThunderAgent plus a few additions, each behind a flag."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from scheduling.kv.ledger import Ledger, decay
from scheduling.kv.plan import Plan, pause_order
from scheduling.kv.thunder import ThunderAgentPolicy
from scheduling.kv.view import KvView, ProgramStatus, ProgramView


@dataclass(frozen=True)
class AgentdOptions:
    """Each flag turns one addition on or off for an ablation (bench/kv.py runs them).

    predicted_hold: a program keeps full weight for its predicted tool time (its own
        mean tool time, capped at `hold_cap_s`) after its tool starts, then decays
        with the global λ; while held it is paused only after every unheld ACTING
        program. The paper's global decay assumes tool time is unpredictable; when a
        program's history says when it returns, evicting it (or letting newcomers
        into its room) during the tool only buys a recompute on its return.
    fleet_prior: a program with no tool history yet is predicted the fleet-wide
        mean of the programs' mean tool times (`config.default_tool_time_s` before
        any tool was seen) instead of 0, so a new program's first tool does not
        reopen its room at once. Needs `predicted_hold`. Off by default: in the
        synthetic-agent sweep it cost throughput at high load (bench/kv.py ablation).
    spread_admission: a new program goes to the fitting worker with the most room
        left (spreading load, so no worker idles at low load); restores keep best fit.
    share_prefix: programs of one prefix group on one worker hold the shared prefix
        once (vLLM's prefix cache dedups it), so demand and placement cost count it once.
        Off by default: counting the prefix per program is the only slack the ledger
        leaves for running requests' decode growth, and without it the engine
        preempts and the LRU drops ACTING programs' blocks (bench/kv.py ablation).
    migration_cost: a restore goes to the fitting worker where the fewest tokens
        must be recomputed (its blocks still cached there, or its prefix group
        resident), best fit breaking ties. ThunderAgent assumes all KV is gone.
    smooth_admission: at most `admits_per_tick` new programs per worker per step,
        and only into room left after reserving `growth_reserve` of capacity, so a
        burst of arrivals does not fill a worker that running contexts will outgrow.
        Off by default: the reserve bought about 3% at 32 programs but cost 3% at
        256, and 14-22% at 256 once force-resume no longer forces rotation, where
        it keeps newcomers (short contexts, many per GB of KV) out behind
        long-context programs (bench/kv.py ablation).

    There is no "patient" force-resume: waiting past `force_resume_s` for really
    free room is the same as a longer timeout without its bound (in the synthetic
    sweep at 256 programs it left 223 programs unserved for up to 300 s). A longer
    `KvConfig.force_resume_s` gives that throughput and keeps a bound.
    """

    predicted_hold: bool = True
    hold_cap_s: float = 5.0
    fleet_prior: bool = False
    spread_admission: bool = True
    share_prefix: bool = False
    migration_cost: bool = True
    smooth_admission: bool = False
    admits_per_tick: int = 4
    growth_reserve: float = 0.05


class AgentdPolicy(ThunderAgentPolicy):
    """ThunderAgent with predicted tool hold, spread admission, migration-cost-aware
    restore and (opt-in) fleet prior, prefix sharing and smoothed admission; see
    `AgentdOptions` for each one and its flag."""

    name = "agentd"

    def __init__(self, options: AgentdOptions | None = None) -> None:
        self.options = options or AgentdOptions()
        self.share_prefix = self.options.share_prefix

    def weight(self, program: ProgramView, view: KvView, now: float) -> float:
        return self._weight(program, view, now, fleet_tool_mean(view))

    def pause_key(self, program: ProgramView, view: KvView, now: float) -> Any:
        return self._pause_key(program, now, fleet_tool_mean(view))

    def fits(self, plan: Plan, worker_id: str, program: ProgramView) -> bool:
        low = plan.view.config.low_watermark
        if plan.ledger.room(worker_id, low) < plan.ledger.cost(worker_id, program):
            return False
        if not self.options.smooth_admission or program.status is not ProgramStatus.QUEUED:
            return True
        if plan.admitted[worker_id] >= self.options.admits_per_tick:
            return False
        reserve = plan.ledger.limit(worker_id, self.options.growth_reserve)
        return plan.ledger.room(worker_id, low) - reserve >= (
            plan.ledger.cost(worker_id, program)
        )

    def choose_worker(self, plan: Plan, program: ProgramView) -> str | None:
        fitting = [
            w for w in plan.ledger.worker_ids()
            if plan.ledger.is_healthy(w) and self.fits(plan, w, program)
        ]
        if program.status is ProgramStatus.QUEUED and self.options.spread_admission:
            return roomiest_fit(plan, fitting, program)
        if not self.options.migration_cost:
            return super().choose_worker(plan, program)
        return min(fitting, key=lambda w: _restore_score(plan, w, program), default=None)

    def _plan(self, view: KvView, now: float) -> Plan:
        prior = fleet_tool_mean(view)
        ledger = Ledger(view, lambda p: self._weight(p, view, now, prior), self.share_prefix)
        return Plan(view, ledger, lambda p: self._pause_key(p, now, prior))

    def _weight(self, program: ProgramView, view: KvView, now: float, prior: float) -> float:
        if program.status is not ProgramStatus.ACTING or program.acting_since is None:
            return 1.0
        elapsed = now - program.acting_since - self._hold(program, prior)
        return decay(elapsed, view.config.decay_lambda)

    def _pause_key(self, program: ProgramView, now: float, prior: float) -> Any:
        reasoning, tokens, pid = pause_order(program)
        return (reasoning, self._held(program, now, prior), tokens, pid)

    def _held(self, program: ProgramView, now: float, prior: float) -> bool:
        if program.acting_since is None:
            return False
        return now - program.acting_since < self._hold(program, prior)

    def _hold(self, program: ProgramView, prior: float) -> float:
        """Seconds of full weight after a tool starts: the predicted tool time."""
        if not self.options.predicted_hold:
            return 0.0
        mean = program.tool_time_mean_s
        if mean is None:
            mean = prior if self.options.fleet_prior else None
        return mean if mean is not None and mean <= self.options.hold_cap_s else 0.0


def fleet_tool_mean(view: KvView) -> float:
    """Mean of the live programs' mean tool times; the configured default before
    any tool was observed. The prediction for a program without history."""
    means = [p.tool_time_mean_s for p in view.programs if p.tool_time_mean_s is not None]
    return statistics.fmean(means) if means else view.config.default_tool_time_s


def roomiest_fit(plan: Plan, fitting: list[str], program: ProgramView) -> str | None:
    """The fitting worker with the most room left after placing `program`."""
    low = plan.view.config.low_watermark

    def leftover(worker_id: str) -> tuple[float, str]:
        return (plan.ledger.room(worker_id, low) - plan.ledger.cost(worker_id, program), worker_id)

    return max(fitting, key=leftover, default=None)


def recompute_tokens(plan: Plan, worker_id: str, program: ProgramView) -> int:
    """Tokens `program` must prefill again if it next runs on `worker_id`."""
    if program.status is ProgramStatus.QUEUED:
        return 0
    if program.worker_id == worker_id and program.kv_resident:
        return 0
    return program.context_tokens - plan.ledger.cached_prefix(worker_id, program)


def _restore_score(plan: Plan, worker_id: str, program: ProgramView) -> tuple[int, float, str]:
    low = plan.view.config.low_watermark
    leftover = plan.ledger.room(worker_id, low) - plan.ledger.cost(worker_id, program)
    return (recompute_tokens(plan, worker_id, program), leftover, worker_id)
