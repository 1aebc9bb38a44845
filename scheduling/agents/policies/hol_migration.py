"""Head-of-line migration: a call waiting behind a busy instance moves to an idle one
of the same agent (NALAR Fig. 6, for every session rather than one).

Per idle instance (nothing queued, a slot free; those with no call waiting for a
dependency first), at most one call per step, from the instance whose queue has waited
longest: its highest-priority queued call, and of those the one furthest back (it
would wait longest, and it is the least likely to have started by the time the
decision lands: views are a moment old). An instance whose calls all wait for
dependencies is idle too: an agent whose every call fans out first (an analyst
waiting on its sub-agents) would otherwise never have anywhere to move to.

A session with an installed route (state kept on its instance) moves whole, state and
all, and rebuilds that state at the destination (the analyst's KV recompute), so it
moves only if it expects to wait longer than that rebuild takes: the session's
`state_s` where its host prices it, and at least one mean service time (one call's
work is the least that built the state; the host may not price it). A call of a
session without a route moves when it would wait longer than its `state_s` (nothing
to rebuild: at once). Its expected wait is the time left of the running calls ahead
of it plus the mean per queued call ahead (estimates.py). Both seen in
bench/runtime_imbalance.py's analyst at load 1.2: sessions with ~100k tokens of
context moved to skip half a second and recomputed for ten to seventeen, and a
mean-only estimate leaves a call behind a long prefill where it is.

A rebuild is work the agent's instances would not otherwise do, so it is paid from
their slack: a step moves calls only while the state they rebuild (summed `state_s`)
fits in the idle time the agent's instances had over the utilisation window (the
instances minus their summed utilisation, times the window: ~30 s). An instance idle
at the step of a pool busy all the time is a gap between two calls of its own
sessions, not room: a rebuild put there delays them, and they come back at once.
Measured in bench/runtime_imbalance.py's analyst at load 1.4 (Analyst instances ~98%
busy), the three default policies together: without the test moves rebuilt 78 s of
state and mean / P99 latency were 15.7 / 39.3 s against static's 15.5 / 38.6; with it
49 s, 15.0 / 38.4 s. At loads up to 1.3 it changes nothing there.
"""

from __future__ import annotations

from scheduling.agents.local import UTIL_TAU_S
from scheduling.agents.policies.estimates import mean_service, running_s
from scheduling.agents.policy import (
    ControlDecision,
    ControlPolicy,
    ControlView,
    FutureStatus,
    FutureView,
    InstanceView,
    migrate,
)


def _blocked(view: ControlView, agent: str, now: float) -> list[InstanceView]:
    busy = [i for i in view.instances_of(agent) if i.queued and i.running >= i.slots]
    return sorted(busy, key=lambda i: now if i.oldest_queued_at is None else i.oldest_queued_at)


class HeadOfLineMigration(ControlPolicy):
    name = "hol-migration"

    def __init__(self, window_s: float = UTIL_TAU_S) -> None:
        self.window_s = window_s  # the span the instances' utilisation covers

    def decide(self, view: ControlView, now: float) -> list[ControlDecision]:
        out: list[ControlDecision] = []
        for agent in view.agent_types():
            if view.directives(agent).stateful:
                continue
            alive = view.instances_of(agent)
            idle = sorted((i for i in alive if i.idle), key=lambda i: i.waiting)
            if not idle:
                continue
            service = mean_service(alive)
            picks = (self._head(view, src, agent, service, now)
                     for src in _blocked(view, agent, now))
            movable = [(src, f) for src, f in picks if f is not None]
            slack = (len(alive) - sum(i.utilisation for i in alive)) * self.window_s
            targets = iter(idle)
            for src, f in movable:
                rebuild = _state_s(view, f)
                if rebuild > slack:
                    continue
                dst = next(targets, None)
                if dst is None:
                    break
                slack -= rebuild
                whole = (f.session_id, agent) in view.rules.routes
                out.append(migrate(f.session_id, src.instance_id, dst.instance_id,
                                   None if whole else f.future_id,
                                   reason=f"head-of-line: {dst.instance_id} is idle"))
        return out

    def _head(self, view: ControlView, src: InstanceView, agent: str, service: float,
              now: float) -> tuple[InstanceView, FutureView | None]:
        """The call to move off `src`: the highest-priority, furthest-back queued call
        whose move is worth its state's rebuild."""
        fs = view.futures_at(src.instance_id)
        queued = sorted((f for f in fs if f.status is FutureStatus.QUEUED),
                        key=lambda f: (view.priority(f.session_id, agent), f.seq))
        running = running_s(view, src.instance_id, service, now)
        for k in range(len(queued) - 1, -1, -1):
            f = queued[k]
            ahead = sum(1 for g in queued if (view.priority(g.session_id, agent), -g.seq)
                        > (view.priority(f.session_id, agent), -f.seq))
            if _worth_it(view, f, (running + ahead * service) / src.slots, service):
                return src, f
        return src, None


def _state_s(view: ControlView, f: FutureView) -> float:
    session = view.sessions.get(f.session_id)
    return session.state_s if session is not None else 0.0


def _worth_it(view: ControlView, f: FutureView, wait: float, service: float) -> bool:
    """Whether skipping `wait` pays for rebuilding the call's session state elsewhere."""
    state_s = _state_s(view, f)
    if (f.session_id, f.agent_type) in view.rules.routes:
        return wait > max(service, state_s)
    return not state_s or wait > state_s
