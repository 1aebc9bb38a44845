"""agentd's own KV policy: ThunderAgent plus four additions, each behind a flag."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from scheduling.kv.ledger import decay
from scheduling.kv.plan import Plan, pause_order
from scheduling.kv.thunder import ThunderAgentPolicy
from scheduling.kv.view import KvView, ProgramStatus, ProgramView


@dataclass(frozen=True)
class AgentdOptions:
    """Each flag turns one addition off for an ablation.

    predicted_hold: a program whose own mean tool time is at most `hold_cap_s`
        keeps full weight for that long after its tool starts, then decays with the
        global λ; while held it is paused only after every unheld ACTING program.
        The paper's global decay assumes tool time is unpredictable; when a
        program's own history says its tools are short, evicting it during the tool
        only buys a recompute, and its room stays reserved for its return.
        Programs without history, or with long tools, decay from the start and
        are paused shortest first, as in ThunderAgent.
    share_prefix: programs of one prefix group on one worker hold the shared prefix
        once (vLLM's prefix cache dedups it), so demand and placement cost count it once.
    migration_cost: a restore goes to the fitting worker where the fewest tokens
        must be recomputed (its blocks still cached there, or its prefix group
        resident), best fit breaking ties. ThunderAgent assumes all KV is gone.
    smooth_admission: at most `admits_per_tick` new programs per worker per step,
        and only into room left after reserving `growth_reserve` of capacity, so a
        burst of arrivals does not fill a worker that running contexts will outgrow.
    """

    predicted_hold: bool = True
    hold_cap_s: float = 5.0
    share_prefix: bool = True
    migration_cost: bool = True
    smooth_admission: bool = True
    admits_per_tick: int = 4
    growth_reserve: float = 0.05


class AgentdPolicy(ThunderAgentPolicy):
    """ThunderAgent with predicted tool hold, prefix sharing, migration-cost-aware
    restore and admission smoothing; see `AgentdOptions` for each one and its flag."""

    name = "agentd"

    def __init__(self, options: AgentdOptions | None = None) -> None:
        self.options = options or AgentdOptions()
        self.share_prefix = self.options.share_prefix

    def weight(self, program: ProgramView, view: KvView, now: float) -> float:
        if not self.options.predicted_hold or program.acting_since is None:
            return super().weight(program, view, now)
        if program.status is not ProgramStatus.ACTING:
            return 1.0
        return decay(now - program.acting_since - self._hold(program), view.config.decay_lambda)

    def pause_key(self, program: ProgramView, view: KvView, now: float) -> Any:
        reasoning, tokens, pid = pause_order(program)
        return (reasoning, self._held(program, now), tokens, pid)

    def fits(self, plan: Plan, worker_id: str, program: ProgramView) -> bool:
        if not super().fits(plan, worker_id, program):
            return False
        if not self.options.smooth_admission or program.status is not ProgramStatus.QUEUED:
            return True
        if plan.admitted[worker_id] >= self.options.admits_per_tick:
            return False
        reserve = plan.ledger.limit(worker_id, self.options.growth_reserve)
        return plan.ledger.room(worker_id, plan.view.config.low_watermark) - reserve >= (
            plan.ledger.cost(worker_id, program)
        )

    def choose_worker(self, plan: Plan, program: ProgramView) -> str | None:
        if not self.options.migration_cost:
            return super().choose_worker(plan, program)
        fitting = [
            w for w in plan.ledger.worker_ids()
            if plan.ledger.is_healthy(w) and self.fits(plan, w, program)
        ]
        return min(fitting, key=lambda w: _restore_score(plan, w, program), default=None)

    def _held(self, program: ProgramView, now: float) -> bool:
        if not self.options.predicted_hold or program.acting_since is None:
            return False
        return now - program.acting_since < self._hold(program)

    def _hold(self, program: ProgramView) -> float:
        mean = program.tool_time_mean_s
        return mean if mean is not None and mean <= self.options.hold_cap_s else 0.0


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

