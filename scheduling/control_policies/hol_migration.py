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
moves only if it expects to wait longer than one mean service time: the view does not
price a session's state, and one call's work is the least that built it. Its expected
wait is the time left of the running calls ahead of it plus the mean per queued call
ahead; service times are heavy-tailed, so a call that has run past the mean is expected
to run about as long again. Both seen in bench/runtime_imbalance.py's analyst at load
1.2: sessions with ~100k tokens of context moved to skip half a second and recomputed
for ten, and a mean-only estimate leaves a call behind a long prefill where it is.
"""

from __future__ import annotations

from scheduling.control import (
    ControlDecision,
    ControlPolicy,
    ControlView,
    FutureStatus,
    FutureView,
    InstanceView,
    migrate,
)

DEFAULT_SERVICE_S = 1.0  # an agent type nobody has timed yet


def _blocked(view: ControlView, agent: str, now: float) -> list[InstanceView]:
    busy = [i for i in view.instances_of(agent) if i.queued and i.running >= i.slots]
    return sorted(busy, key=lambda i: now if i.oldest_queued_at is None else i.oldest_queued_at)


def _mean_service(instances: list[InstanceView]) -> float:
    timed = [i.mean_service_s for i in instances if i.completed]
    return sum(timed) / len(timed) if timed else DEFAULT_SERVICE_S


class HeadOfLineMigration(ControlPolicy):
    name = "hol-migration"

    def decide(self, view: ControlView, now: float) -> list[ControlDecision]:
        out: list[ControlDecision] = []
        for agent in view.agent_types():
            if view.directives(agent).stateful:
                continue
            alive = view.instances_of(agent)
            idle = sorted((i for i in alive if i.idle), key=lambda i: i.waiting)
            if not idle:
                continue
            service = _mean_service(alive)
            picks = (self._head(view, src, agent, service, now)
                     for src in _blocked(view, agent, now))
            movable = [(src, f) for src, f in picks if f is not None]
            for dst, (src, f) in zip(idle, movable, strict=False):
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
        running = sum(max(service - (now - f.started_at), now - f.started_at) for f in fs
                      if f.status is FutureStatus.RUNNING and f.started_at is not None)
        for k in range(len(queued) - 1, -1, -1):
            f = queued[k]
            ahead = sum(1 for g in queued if (view.priority(g.session_id, agent), -g.seq)
                        > (view.priority(f.session_id, agent), -f.seq))
            if (f.session_id, agent) not in view.rules.routes or \
                    (running + ahead * service) / src.slots > service:
                return src, f
        return src, None
