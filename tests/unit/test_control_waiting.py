"""The waiting room (scheduling/agents/waiting.py) in the cluster: a call with no room
for an instance of its type waits instead of failing, is placed when a kill or a
provision makes room, and fails after `resource_wait_s` of readiness with the agent,
resource, need and free named; only ready calls hold younger calls of other types
back; and the migration property test again with waits."""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduling.agents.cluster import Cluster
from scheduling.agents.policy import DRIVER, Directives, FutureStatus, Kill, Provision, Route
from scheduling.agents.resources import NoCapacity
from scheduling.agents.waiting import WAITING_ROOM, unplaced
from tests.unit.test_control_migration import OPS, World

CAP = {"memory_mb": 1024.0, "CPU": 2.0, "GPU": 0.0}
AGENTS = {"Holder": Directives(min_instances=1, max_instances=2, resources={"memory_mb": 400}),
          "Late": Directives(min_instances=0, max_instances=2, resources={"memory_mb": 300}),
          "Chat": Directives(stateful=True, min_instances=0, resources={"memory_mb": 300}),
          "Huge": Directives(resources={"memory_mb": 4096})}


def full(wait_s: float | None = 5.0) -> Cluster:
    """Two Holders reserve 800 of 1024 MiB: no room for a Late (300) or a Chat (300)."""
    c = Cluster(AGENTS, grow_on_demand=True, capacity=CAP, resource_wait_s=wait_s)
    c.add_instance("Holder")
    c.add_instance("Holder")
    c.take_events()
    return c


def kinds(c: Cluster) -> list[dict[str, Any]]:
    return [e for e in c.take_events() if e["event"].startswith("future.")]


def run_all(c: Cluster, now: float) -> list[str]:
    """Start and finish every startable call; returns them in order."""
    ran: list[str] = []
    while startable := c.startable():
        for inst in startable:
            while (s := c.start_next(inst, now)) is not None:
                ran.append(s.future.future_id)
                c.finish(inst, s.future.future_id, f"v:{s.future.future_id}", True, now)
    return ran


def test_a_call_without_room_waits_and_a_kill_places_it() -> None:
    c = full()
    assert c.create("late", "s", "Late", 1.0) == WAITING_ROOM
    waiting = kinds(c)
    assert [e["event"] for e in waiting] == ["future.waiting"]
    w = waiting[0]
    assert (w["agent_type"], w["resource"], w["need"], w["free"], w["capacity"]) == \
        ("Late", "memory_mb", 300, 224, 1024)
    assert "Late reserves memory_mb=300" in w["reason"] and w["wait_s"] == 5.0
    assert c.waiting() == 1 and c.next_deadline() == 6.0  # ready at once: 1 + 5 s
    assert run_all(c, 2.0) == []  # nothing runs it while it waits
    assert not c.expire(5.9)
    assert c.apply([Kill("Holder#1")], 3.0)[0].ok  # 400 MiB back: a Late fits
    placed = [e for e in kinds(c) if e["event"] == "future.placed"]
    assert [(e["id"], e["instance"]) for e in placed] == [("late", "Late#0")]
    assert "after 2.0 s waiting for resources" in placed[0]["reason"]
    assert c.waiting() == 0 and run_all(c, 4.0) == ["late"]
    assert c.controllers[DRIVER].results["late"] == ("v:late", True)


def test_a_wait_that_runs_out_fails_the_call_and_its_consumers_hear_it() -> None:
    c = full()
    c.create("late", "s", "Late", 1.0)
    c.create("after", "s", "Holder", 1.5, deps=["late"])  # a consumer of the waiting call
    assert c.expire(5.99) == []
    failed = c.expire(6.0)
    assert [fid for fid, _ in failed] == ["late"]
    why = failed[0][1]
    assert why.startswith("agent Late waited 5 s for resources and none freed")
    assert "memory_mb=300" in why and "224 of the run's memory_mb=1024 is free" in why
    expired = [e for e in kinds(c) if e["event"] == "future.wait_expired"]
    assert len(expired) == 1 and expired[0]["resource"] == "memory_mb"
    assert c.controllers[DRIVER].results["late"] == (None, False)
    started = c.start_next("Holder#0", 6.0) or c.start_next("Holder#1", 6.0)
    assert started is not None and started.values == {"late": (None, False)}
    assert c.waiting() == 0


def test_the_wait_counts_from_readiness_not_creation() -> None:
    c = full()
    c.create("dep", "s", "Holder", 0.0)
    c.create("late", "s", "Late", 0.0, deps=["dep"])
    assert c.next_deadline() is None and c.expire(100.0) == []  # not ready: no clock
    assert c.waiting() == 1
    c.start_next("Holder#0", 100.0)
    c.finish("Holder#0", "dep", "v:dep", True, 101.0)
    assert c.next_deadline() == 106.0
    assert c.apply([Kill("Holder#1")], 102.0)[0].ok
    ran: list[tuple[str, Any]] = []
    s = c.start_next("Late#0", 103.0)
    assert s is not None
    ran.append((s.future.future_id, s.values))
    assert ran == [("late", {"dep": ("v:dep", True)})]


def test_calls_of_a_type_are_placed_first_come_first_placed() -> None:
    c = full()
    for i in range(3):
        assert c.create(f"l{i}", "s", "Late", float(i)) == WAITING_ROOM
    # a provision of the waiting type itself does not fit either: refused
    assert not c.apply([Provision("Late")], 3.0)[0].ok
    assert c.waiting() == 3
    c.take_events()
    assert c.apply([Kill("Holder#1")], 4.0)[0].ok
    assert c.waiting() == 0
    # 624 MiB free: two Lates fit (max_instances 2), placed in the calls' order
    placed = [(e["id"], e["instance"]) for e in kinds(c) if e["event"] == "future.placed"]
    assert placed == [("l0", "Late#0"), ("l1", "Late#1"), ("l2", "Late#0")]
    assert sorted(run_all(c, 5.0)) == ["l0", "l1", "l2"]


def test_stateful_calls_take_their_turns_when_they_leave() -> None:
    c = full(wait_s=1.0)
    c.create("c0", "s", "Chat", 0.0)  # fails waiting: must leave no gap in the turns
    assert [fid for fid, _ in c.expire(1.0)] == ["c0"]
    c.create("c1", "s", "Chat", 2.0)
    c.create("c2", "s", "Chat", 2.0)
    assert c.apply([Kill("Holder#1")], 2.5)[0].ok
    assert run_all(c, 3.0) == ["c1", "c2"]  # turns 0 and 1 on Chat#0: neither parked


def test_an_agent_that_never_fits_is_refused_at_once() -> None:
    c = full()
    with pytest.raises(NoCapacity, match="no live instance of Huge"):
        c.create("h", "s", "Huge", 0.0)
    assert not c.knows("h") and c.waiting() == 0


def test_without_a_wait_a_call_without_room_is_refused() -> None:
    for wait in (None, 0.0):
        c = full(wait_s=wait)
        with pytest.raises(NoCapacity, match="no live instance of Late"):
            c.create("late", "s", "Late", 0.0)
        assert WAITING_ROOM not in c.controllers


def test_cold_start_activation_places_waiting_calls() -> None:
    c = Cluster({"W": Directives(min_instances=0, resources={"CPU": 1})}, capacity={"CPU": 1},
                cold_start=True, resource_wait_s=10.0)
    assert c.apply([Provision("W")], 0.0)[0].ok  # STARTING: holds the CPU, serves nothing
    assert c.create("w", "s", "W", 1.0) == WAITING_ROOM
    c.activate("W#0", 2.0)
    assert c.waiting() == 0 and run_all(c, 3.0) == ["w"]


def test_forgetting_the_session_clears_the_room() -> None:
    c = full(wait_s=1.0)
    c.create("a", "s", "Late", 0.0)
    c.create("b", "s", "Late", 0.0)
    c.expire(1.0)  # both fail
    c.create("d", "s", "Late", 2.0)
    c.apply([Kill("Holder#1")], 2.0)
    run_all(c, 3.0)
    c.forget_session("s")
    for name in (WAITING_ROOM, unplaced("Late")):
        ctl = c.controllers[name]
        assert not (ctl.held or ctl.done or ctl.moved or ctl._records), name


# --- the migration property test, with waits for resources ----------------------------

WAIT_AGENTS = {
    "A": Directives(min_instances=0, max_instances=3, resources={"memory_mb": 100}),
    "B": Directives(min_instances=0, max_instances=3, resources={"memory_mb": 200}),
    "S": Directives(stateful=True, min_instances=0, max_instances=2,
                    resources={"memory_mb": 100})}
WAIT_OPS = (*OPS, "expire")
UNPARKED = {"create", "kill", "provision", "priority", "expire"}  # ops that end unparked


def settled(c: Cluster) -> Counter[str]:
    """After an `unpark`: no waiting call is left that the rule would place, that is
    one whose type has an instance, or whose instance fits and no ready call of another
    type older than it waits. Counts the cases seen, to show they occur."""
    room = c.room
    assert room is not None
    seen: Counter[str] = Counter()
    firsts: dict[str, int | None] = dict.fromkeys(room._queues)
    for f in room.waiting():  # the oldest ready call per type, read from the calls
        first = firsts[f.agent_type]
        if f.status is FutureStatus.QUEUED and (first is None or f.seq < first):
            firsts[f.agent_type] = f.seq
    for t in room._queues:
        head = room.head(t)
        if head is None:  # its Submit is on its way: it is placed at a later unpark
            continue
        older_ready = [u for u, r in firsts.items() if u != t and r is not None and r < head.seq]
        assert not c.alive(t), (t, head.future_id)
        if c.room_for(t) is None:
            assert older_ready, f"{head.future_id} of {t} fits and no older ready call waits"
            seen["fits, held back by an older ready call"] += 1
        if head.status is FutureStatus.WAITING:
            seen["a call not ready waits"] += 1
            younger = [u for u, r in firsts.items() if u != t and r is not None and r > head.seq]
            seen["... with a younger ready call of another type waiting"] += bool(younger)
    return seen


class WaitWorld(World):
    """World's random schedules in a run full of As: the calls of B and S wait until
    kills of As make room for them (a kill never takes a type's last serving instance:
    the validation refuses it), and time jumps end waits. A B needs twice an S's room:
    an S can fit while an older B waits."""

    def __init__(self) -> None:
        super().__init__()
        self.c = Cluster(WAIT_AGENTS, auto_pump=False, capacity={"memory_mb": 400},
                         resource_wait_s=2.5)
        for _ in range(4):  # full: B's and S's calls wait until kills of As make room
            self.c.add_instance("A")
        assert self.c.apply([Route("A", "A#0", "s0")], 0.0)[0].ok
        self.failed: Counter[str] = Counter()
        self.settled: Counter[str] = Counter()

    def op_expire(self, a: int, b: int, k: int) -> None:
        self.now += 1.0
        for fid, why in self.c.expire(self.tick()):
            assert "waited 2.5 s for resources" in why
            self.failed[fid] += 1

    def do(self, op: str, a: int, b: int, k: int) -> None:
        super().do(op, a, b, k)
        if op in UNPARKED:
            self.settled.update(settled(self.c))

    def op_create(self, a: int, b: int, k: int) -> None:
        try:
            super().op_create(a, b, k)
        except NoCapacity as exc:  # a call's instance can fit: never refused
            raise AssertionError(f"refused: {exc}") from exc

    def drain(self, rng: random.Random) -> None:
        for _ in range(1000):
            super().drain(rng)
            if not self.c.waiting():
                return
            self.op_expire(0, 0, 0)
        raise AssertionError("the waits did not end")

    def check(self) -> None:
        assert not self.c.outbox and self.c.waiting() == 0
        assert self.c.room is not None and not self.c.room.hold.ready  # nothing kept per call
        for fid, dep in self.c.take_dependency_failures():  # failed at once, waiting
            assert dep in self.failed and dep in self.calls[fid][2], (fid, dep)
            self.failed[fid] += 1
        assert set(self.started) | set(self.failed) == set(self.calls), "a call was lost"
        assert not set(self.started) & set(self.failed), "a call ran and failed"
        assert all(n == 1 for n in (self.started + self.failed).values())
        for fid, (_session, _agent, deps, creator) in self.calls.items():
            if fid in self.started:
                want = {d: None if d in self.failed else f"v:{d}" for d in deps}
                assert self.ran_with[fid] == want, fid
                assert self.c.controllers[creator].results[fid] == (f"v:{fid}", True)
            else:
                assert self.c.controllers[creator].results[fid] == (None, False)
        for c in self.c.controllers.values():
            assert not c.held, f"{c.id} still holds {list(c.held)}"
            assert not any(c.stash.values()), f"{c.id} has undelivered {c.stash}"
        for session, turns in self.stateful_order.items():
            assert turns == list(range(len(turns))), (session, turns)


wait_op = st.tuples(st.sampled_from(WAIT_OPS), st.integers(0, 999), st.integers(0, 999),
                    st.integers(0, 999))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(wait_op, min_size=10, max_size=250), st.integers(0, 2**32))
def test_waits_never_run_a_call_twice_or_lose_one(ops: list[Any], seed: int) -> None:
    w = WaitWorld()
    for name, a, b, k in ops:
        w.do(name, a, b, k)
    w.drain(random.Random(seed))
    w.check()
    w.check_forgotten()


def test_waits_placements_and_expiries_actually_happen() -> None:
    """Not vacuous: over seeded schedules calls do wait, leave placed, and run out."""
    counts: Counter[str] = Counter()
    for seed in range(40):
        rng = random.Random(seed)
        w = WaitWorld()
        for _ in range(200):
            w.do(rng.choice(WAIT_OPS), rng.randrange(1000), rng.randrange(1000),
                 rng.randrange(1000))
        w.drain(rng)
        w.check()
        counts.update(w.settled)
        for e in w.c.take_events():
            if e["event"] == "future.placed" and "waiting for resources" in e["reason"]:
                counts["placed after waiting"] += 1
            elif e["event"] in ("future.waiting", "future.wait_expired",
                                "future.dependency_failed"):
                counts[e["event"]] += 1
        w.check_forgotten()
    assert counts["future.waiting"] > 50, counts
    assert counts["placed after waiting"] > 10 and counts["future.wait_expired"] > 10, counts
    assert counts["future.dependency_failed"] > 5, counts
    assert counts["fits, held back by an older ready call"] > 10, counts
    assert counts["... with a younger ready call of another type waiting"] > 10, counts


# --- what the room keeps, dependency failures, room first come first served ------------


def test_the_room_keeps_nothing_per_call_once_its_calls_left() -> None:
    """Hundreds of waits, half placed after a kill and half run out: the room's
    controller ends each round as empty as it began (it once kept a heap entry and an
    arrival record per call that ever waited ready)."""
    c = full(wait_s=1.0)
    room = c.room
    assert room is not None
    hold = room.hold
    for i in range(300):
        now, session = 10.0 * i, f"s{i}"
        c.create(f"l{i}", session, "Late", now)
        assert hold.held[f"l{i}"].view.status is FutureStatus.QUEUED  # ready, waiting
        if i % 2:
            assert [fid for fid, _ in c.expire(now + 1.0)] == [f"l{i}"]
        else:
            assert c.apply([Kill(c.alive("Holder")[-1].id)], now + 1.0)[0].ok
            assert run_all(c, now + 2.0) == [f"l{i}"]
            late = c.alive("Late")[0].id
            assert c.apply([Kill(late)], now + 3.0, validate=False)[0].ok
            c.add_instance("Holder")  # full again
        c.forget_session(session)
        assert not (hold.held or hold._queue or hold._arrivals or hold._n_queued), i
        assert not (room._queues or room.expiring or hold.done or hold.moved or hold.ready), i
        assert not hold._records and not any(s.done or s._records for s in room.sinks.values())


def test_a_waiting_call_whose_dependency_fails_fails_at_once() -> None:
    c = full()
    c.create("dep", "s", "Holder", 0.0)
    c.create("other", "s", "Holder", 0.0)
    assert c.create("late", "s", "Late", 0.5, deps=["dep", "other"]) == WAITING_ROOM
    c.create("after", "s", "Holder", 0.6, deps=["late"])  # a consumer of the waiting call
    c.take_events()
    started = {s.future.future_id: inst for inst in ("Holder#0", "Holder#1")
               if (s := c.start_next(inst, 1.0)) is not None}
    assert set(started) == {"dep", "other"}
    c.finish(started["dep"], "dep", None, False, 1.5)
    # no room freed and no wait ran out: the failure shows at once
    assert c.take_dependency_failures() == [("late", "dep")]
    assert c.take_dependency_failures() == []
    assert c.waiting() == 0 and c.next_deadline() is None
    assert c.controllers[DRIVER].results["late"] == (None, False)
    [e] = [e for e in kinds(c) if e["event"] == "future.dependency_failed"]
    assert (e["id"], e["dependency"], e["agent_type"]) == ("late", "dep", "Late")
    # its consumer hears it as any failure; the other dependency's value, later, is dropped
    c.finish(started["other"], "other", "v:other", True, 2.0)
    s = c.start_next(started["dep"], 2.0)
    assert s is not None and s.future.future_id == "after"
    assert s.values == {"late": (None, False)}
    c.finish(started["dep"], "after", None, False, 2.5)
    assert all(not ctl.held and not ctl.stash for ctl in c.controllers.values())
    assert "s" not in c.view(3.0).sessions  # every call of the session is counted out


def test_a_waiting_call_not_ready_yet_fails_at_once_too() -> None:
    """Its wait for room has not even started (no clock until it is ready)."""
    c = full()
    c.create("dep", "s", "Holder", 0.0)
    c.create("late", "s", "Late", 0.0, deps=["dep"])
    c.create("later", "s", "Late", 0.0, deps=["late"])  # waits behind it, for it
    assert c.start_next("Holder#0", 1.0) is not None
    c.finish("Holder#0", "dep", None, False, 2.0)
    assert c.take_dependency_failures() == [("late", "dep"), ("later", "late")]
    assert c.waiting() == 0 and c.controllers[DRIVER].results["later"] == (None, False)


BIG = {**AGENTS, "Big": Directives(min_instances=0, resources={"memory_mb": 700}),
       "Tiny": Directives(min_instances=0, resources={"memory_mb": 100})}


def test_room_goes_first_come_first_served_across_types() -> None:
    c = Cluster(BIG, grow_on_demand=True, capacity=CAP, resource_wait_s=5.0)
    c.add_instance("Holder")
    c.add_instance("Holder")
    assert c.create("big", "s", "Big", 0.0) == WAITING_ROOM
    assert c.create("late", "s", "Late", 1.0) == WAITING_ROOM
    assert c.apply([Kill("Holder#1")], 2.0)[0].ok
    # 624 MiB free: room for a Late (300), not for the older Big (700): the Late waits
    assert c.waiting() == 2
    c.take_events()
    assert c.create("tiny", "s", "Tiny", 2.5) == WAITING_ROOM  # fits, but waits its turn
    [w] = kinds(c)
    assert w["resource"] is None and "calls of Big, Late have waited longer" in w["reason"]
    # a type with an instance still gets its calls, on that instance: no new one
    assert c.create("h0", "s", "Holder", 2.6) == "Holder#0"
    assert c.create("h1", "s", "Holder", 2.7) == "Holder#0"  # it would have grown
    c.take_events()
    assert [fid for fid, _ in c.expire(5.0)] == ["big"]
    placed = [(e["id"], e["instance"]) for e in kinds(c) if e["event"] == "future.placed"]
    assert placed == [("late", "Late#0"), ("tiny", "Tiny#0")]
    assert sorted(run_all(c, 6.0)) == ["h0", "h1", "late", "tiny"]
    assert c.waiting() == 0


def test_without_an_older_call_waiting_a_type_grows_as_before() -> None:
    c = Cluster(BIG, grow_on_demand=True, capacity=CAP, resource_wait_s=5.0)
    c.add_instance("Holder")
    assert c.create("h0", "s", "Holder", 0.0) == "Holder#0"
    assert c.create("h1", "s", "Holder", 0.1) == "Holder#1"  # grown on demand
    assert c.create("tiny", "s", "Tiny", 0.2) == "Tiny#0"


# --- only ready calls hold younger calls of other types back (issue #6) ----------------


def with_a_running_dependency() -> Cluster:
    """full(), its Holder#0 busy running `dep` (as long as it takes)."""
    c = Cluster(BIG, grow_on_demand=True, capacity=CAP, resource_wait_s=5.0)
    c.add_instance("Holder")
    c.add_instance("Holder")
    c.create("dep", "s", "Holder", 0.0)
    started = c.start_next("Holder#0", 0.0)
    assert started is not None and started.future.future_id == "dep"
    return c


def test_a_call_not_ready_yet_holds_no_younger_call_back() -> None:
    c = with_a_running_dependency()
    assert c.create("big", "s", "Big", 0.5, deps=["dep"]) == WAITING_ROOM
    assert c.apply([Kill("Holder#1")], 1.0)[0].ok  # 624 MiB free: not for a Big (700)
    # the older Big is not ready (its dependency still runs): a Late takes the free room
    assert c.create("late", "s", "Late", 1.5) == "Late#0"
    assert c.waiting() == 1 and c.next_deadline() is None
    # once ready it holds the younger calls back: a Tiny would fit (324 free), and waits
    c.finish("Holder#0", "dep", "v:dep", True, 2.0)
    assert c.next_deadline() == 7.0
    c.take_events()
    assert c.create("tiny", "s", "Tiny", 2.5) == WAITING_ROOM
    [w] = kinds(c)
    assert w["resource"] is None and "calls of Big have waited longer" in w["reason"]
    assert c.create("chained", "s", "Tiny", 2.6, deps=["late"]) == WAITING_ROOM
    assert [fid for fid, _ in c.expire(7.0)] == ["big"]  # its wait ran out: room is free
    placed = [(e["id"], e["instance"]) for e in kinds(c) if e["event"] == "future.placed"]
    assert placed == [("tiny", "Tiny#0"), ("chained", "Tiny#0")]
    assert run_all(c, 8.0) == ["late", "tiny", "chained"]
    assert c.waiting() == 0


def test_unpark_passes_a_call_not_ready_but_not_a_younger_ready_one() -> None:
    """One pass over the waiting types: a Big whose head is not ready but whose second
    call is holds back only the calls younger than that second call."""
    c = with_a_running_dependency()
    assert c.create("big0", "s", "Big", 0.1, deps=["dep"]) == WAITING_ROOM
    assert c.create("late", "s", "Late", 0.2) == WAITING_ROOM  # no room at all yet
    assert c.create("big1", "s", "Big", 0.3) == WAITING_ROOM  # ready, behind big0
    assert c.create("tiny", "s", "Tiny", 0.4) == WAITING_ROOM
    c.take_events()
    assert c.apply([Kill("Holder#1")], 1.0)[0].ok  # 624 MiB: a Late and a Tiny fit
    placed = [(e["id"], e["instance"]) for e in kinds(c) if e["event"] == "future.placed"]
    assert placed == [("late", "Late#0")]  # older than big1; the Tiny is younger
    assert c.waiting() == 3
    # big1's wait ends; big0 is still not ready: it holds no one back, and the Tiny goes
    assert [fid for fid, _ in c.expire(5.3)] == ["big1"]
    placed = [(e["id"], e["instance"]) for e in kinds(c) if e["event"] == "future.placed"]
    assert placed == [("tiny", "Tiny#0")]
    assert c.waiting() == 1 and sorted(run_all(c, 6.0)) == ["late", "tiny"]
