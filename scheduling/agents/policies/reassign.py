"""Resource reassignment: instances go from agents with little work waiting to agents
with a backlog, within each agent's min/max_instances and an optional total budget.

An agent's expected wait is the work it holds (its calls, queued, waiting or running,
times its mean service time) per instance it has, serving or still starting (capacity
on its way counts, so that one burst does not provision twice). Each step the agent
with the longest wait gets one more instance, if even with it each instance would
hold at least `min_gain_s` of work (a new instance serves only after its model load:
a backlog that drains sooner is not worth one): a new one while the budget has room,
else one taken from the agent that would then wait least, if that agent would still
wait `min_gain_s` less than the receiver (hysteresis: the next step does not move it
back), serves with more than its min_instances, and over the last ~30 s left at least
`spare` instances' worth of capacity unused (instances minus their summed
utilisation). A backlog alone is no reason to give: a donor's wait shows its queue,
not its arrivals, and one that uses all it has pays for a lost instance long after
the receiver's burst is gone (bench/runtime_imbalance.py measured it: without this
test the analyst's sub-agents are stripped and its P99 grows sixfold at load 1.2).

A move to an agent whose serving instances all hold sessions' state is for good:
this policy takes back only instances without state, and the receiver's sessions
keep it busy. The donor then has to keep `spare` unused with the instance gone, not
only before: its demand may be held back for now (by the receiver itself, upstream of
it) and a 30-s average swings. Measured in the analyst: at load 1.3 each sub-agent
gave one of its 3 instances (under 2 instances' worth used at that moment, 2.08 on
average) to the Analyst and served on at 2, at ~104%, queueing for the rest of the
run: P99 +68% over static, mean latency doubled, and nalar (all three policies) 20%
worse than static; with the test nothing moves there up to load 1.4 and nalar is 12%
better than static at 1.3. (At 1.2 the same move left the sub-agents at ~96%: nalar's
P99 was 4% lower with it, its mean 9% higher.) A move to an agent with a stateless
instance comes back when the burst is gone (the router's coding branch): there a donor
gives at its last instance of slack, so that a burst is not made to wait for it.

A donor with no slack at all may still lend for a move that comes back, when both
queue (overload: someone waits, and the tail is the side that waits longest): if its
backlog is not growing (its wait per instance is no longer than its oldest queued
call has waited, so it served faster than it received since then) and, an instance
down, it would wait at most `ratio` times less than the receiver with it. Measured in
the router (bench/runtime_imbalance.py), nalar's P99 at load 1.2 went 43.6 -> 41.4 s
(3% -> 8% below static), at 1.0 20.6 -> 18.1 s; the coding burst that makes the tail
gets an instance the spare test refused (chat 100% busy, queueing ~15 s against
coding's ~40 s). Without the growth test (ratio 3 alone) P99 at load 1.4 rose 96.1 ->
101.8 s (the chat branch is overloaded there and its queue only grows); with ratio 2
and no growth test, at 1.3 52.7 -> 61.2 s.

A killed instance holds its resources until it has drained, so it counts against the
budget until it is dead. The donor's least-loaded instance holding no session state
is killed: its queued calls move to its siblings, its running ones finish, and its
resources go to the new one.

Calls waiting for room with no instance of their type come first (room.py): a step
that can make room for them does only that.
"""

from __future__ import annotations

from scheduling.agents.policies.room import make_room
from scheduling.agents.policy import (
    ControlDecision,
    ControlPolicy,
    ControlView,
    InstanceState,
    InstanceView,
    kill,
    provision,
)

DEFAULT_SERVICE_S = 1.0  # an agent type nobody has timed yet


class ResourceReassignment(ControlPolicy):
    name = "reassign"

    def __init__(self, budget: int | None = None, min_gain_s: float = 5.0,
                 spare: float = 1.0, ratio: float = 3.0) -> None:
        self.budget = budget
        self.min_gain_s = min_gain_s
        self.spare = spare
        self.ratio = ratio

    def decide(self, view: ControlView, now: float) -> list[ControlDecision]:
        starved = make_room(view, self.budget)
        if starved:
            return starved
        held = {t: h for t in view.agent_types() if (h := view.provisioned(t))}
        work = _work(held)
        n = {t: len(h) for t, h in held.items()}

        def wait(t: str, delta: int = 0) -> float:
            return work[t] / (n[t] + delta) if n[t] + delta > 0 else float("inf")

        if not held:
            return []
        hot = max(held, key=wait)
        gain = wait(hot, 1)
        if n[hot] >= view.directives(hot).max_instances or gain < self.min_gain_s:
            return []
        why = f"{wait(hot):.1f} s of work per instance"
        in_use = sum(i.state is not InstanceState.DEAD for i in view.instances)
        if self.budget is None or in_use < self.budget:
            return [provision(hot, reason=why)]
        # min_instances counts serving instances (the validator's rule): a kill it
        # refuses would leave the provision alone, over the budget
        stateful = set(view.rules.pins.values()) | set(view.rules.routes.values())
        for_good = all(i.instance_id in stateful for i in view.instances_of(hot))

        def lends(alive: list[InstanceView], wait_s: float, after_s: float) -> bool:
            if len(alive) - int(for_good) - sum(i.utilisation for i in alive) >= self.spare:
                return True
            heads = [i.oldest_queued_at for i in alive if i.oldest_queued_at is not None]
            return (not for_good and bool(heads) and wait_s <= now - min(heads)
                    and after_s * self.ratio <= gain)

        donors = [t for t in held if t != hot and wait(t, -1) + self.min_gain_s <= gain
                  and len(alive := view.instances_of(t)) > max(1, view.directives(t).min_instances)
                  and lends(alive, wait(t), wait(t, -1))]
        for donor in sorted(donors, key=lambda t: wait(t, -1)):
            free = [i for i in view.instances_of(donor) if i.instance_id not in stateful]
            if free:
                victim = min(free, key=lambda i: (i.load, i.running)).instance_id
                return [kill(victim, reason=f"reassigned to {hot}"), provision(hot, reason=why)]
        return []


def _work(held: dict[str, list[InstanceView]]) -> dict[str, float]:
    """Per agent type: its calls times its mean service time (over the instances that
    have completed calls; untimed types get the others' mean)."""
    timed: dict[str, float] = {}
    for t, instances in held.items():
        means = [i.mean_service_s for i in instances if i.completed]
        if means:
            timed[t] = sum(means) / len(means)
    fallback = sum(timed.values()) / len(timed) if timed else DEFAULT_SERVICE_S
    return {t: sum(i.load for i in h) * timed.get(t, fallback) for t, h in held.items()}
