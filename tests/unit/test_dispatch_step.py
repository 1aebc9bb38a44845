"""The fast timescale's step (scheduling/dispatch.py) against fake layers: no daemon."""

from __future__ import annotations

from dataclasses import dataclass, field

from scheduling.dispatch import Decision, Dispatch, Park, Refuse, StillParked, dispatch
from scheduling.slo.admission import AdmissionDecision
from scheduling.slo.prediction import QueuedRequest
from scheduling.slo.templates import Slo, TaskType


def req(rid: str) -> QueuedRequest:
    return QueuedRequest(request_id=rid, tenant="a", arrival_s=0.0, prompt_tokens=10,
                         task=TaskType.QA, importance=0.75, slo=Slo(5.0, 0.05), l_pred=100,
                         l_upper=200, ttft_pred_s=0.1, tpot_pred_s=0.01)


class Fifo:
    """An ordered part in arrival order; `broken` makes take pop the wrong request."""

    def __init__(self, *rids: str, broken: bool = False) -> None:
        self.items = [req(r) for r in rids]
        self.broken = broken
        self.pushed: list[str] = []

    def __len__(self) -> int:
        return len(self.items)

    def peek(self, now: float) -> QueuedRequest | None:
        return self.items[0] if self.items else None

    def take(self, head: QueuedRequest, now: float) -> bool:
        if self.broken:
            return False
        self.items.remove(head)
        return True

    def discard(self, request_id: str) -> object:
        self.items = [q for q in self.items if q.request_id != request_id]
        return None

    def push(self, request: QueuedRequest, now: float) -> None:
        self.items.append(request)
        self.pushed.append(request.request_id)


@dataclass
class Layers:
    """Workers with a slot count each; a request routes to `routes[rid]` (None: held)."""

    slots: dict[str, int]
    routes: dict[str, str | None]
    homes: dict[str, str] = field(default_factory=dict)
    ended: set[str] = field(default_factory=set)
    asked: list[tuple[str, str]] = field(default_factory=list)

    def queued(self, request_id: str) -> bool:
        return request_id not in self.ended

    def home(self, request_id: str) -> str | None:
        return self.homes.get(request_id)

    def admits(self, request_id: str, worker: str) -> AdmissionDecision:
        self.asked.append((request_id, worker))
        ok = self.slots[worker] > 0
        return AdmissionDecision(request_id, worker, ok, "room" if ok else "full", 1, 0, 1.0)

    def route(self, request_id: str, now: float) -> str | None:
        return self.routes.get(request_id)

    def has_room(self, worker: str) -> bool:
        return self.slots[worker] > 0


def run(layers: Layers, ordered: Fifo, parked: tuple[str, ...] = (),
        open_: set[str] | None = None) -> list[Decision]:
    """Apply as the daemon does: a dispatch takes a slot before the next decision."""
    out = []
    for d in dispatch(parked, ordered, set(layers.slots) if open_ is None else open_, layers, 0.0):
        if isinstance(d, Dispatch):
            layers.slots[d.worker] -= 1
        out.append(d)
    return out


def dispatched(decisions: list[Decision]) -> list[tuple[str, str]]:
    return [(d.request_id, d.worker) for d in decisions if isinstance(d, Dispatch)]


def test_the_ordered_part_is_served_head_first_while_workers_admit() -> None:
    layers = Layers({"w0": 2, "w1": 1}, {"a": "w0", "b": "w1", "c": "w0", "d": "w1"})
    decisions = run(layers, Fifo("a", "b", "c", "d"))
    assert dispatched(decisions) == [("a", "w0"), ("b", "w1"), ("c", "w0")]
    assert decisions[0] == StillParked(())


def test_a_head_no_open_worker_admits_stops_the_step() -> None:
    """Strict order: the head refused everywhere is not overtaken, and the refusal is
    reported once for the head."""
    layers = Layers({"w0": 0, "w1": 0}, {"a": "w0", "b": "w1"})
    ordered = Fifo("a", "b")
    decisions = run(layers, ordered, open_={"w0", "w1"})
    assert dispatched(decisions) == []
    refusals = [d for d in decisions if isinstance(d, Refuse)]
    assert [r.request_id for r in refusals] == ["a"]
    assert [q.request_id for q in ordered.items] == ["a", "b"]


def test_a_head_whose_worker_is_full_waits_aside_and_the_others_serve() -> None:
    layers = Layers({"w0": 0, "w1": 1}, {"a": "w0", "b": "w1"}, homes={"a": "w0"})
    ordered = Fifo("a", "b")
    decisions = run(layers, ordered, open_={"w0", "w1"})
    assert dispatched(decisions) == [("b", "w1")]
    assert ordered.pushed == ["a"]  # back through push, as if arriving again


def test_a_request_the_kv_policy_holds_is_parked_and_parked_ones_keep_their_order() -> None:
    layers = Layers({"w0": 5}, {"p1": None, "p2": "w0", "p3": None, "a": None, "b": "w0"})
    decisions = run(layers, Fifo("a", "b"), parked=("p1", "p2", "p3"))
    assert dispatched(decisions) == [("p2", "w0"), ("b", "w0")]
    assert StillParked(("p1", "p3")) in decisions
    assert Park("a") in decisions
    assert decisions.index(StillParked(("p1", "p3"))) < decisions.index(Park("a"))


def test_a_worker_that_fills_is_not_asked_again_in_the_step() -> None:
    layers = Layers({"w0": 1}, {"a": "w0", "b": "w0"})
    decisions = run(layers, Fifo("a", "b"))
    assert dispatched(decisions) == [("a", "w0")]
    assert ("b", "w0") not in layers.asked


def test_requests_no_longer_queued_are_dropped_from_both_parts() -> None:
    layers = Layers({"w0": 5}, {"a": "w0", "b": "w0", "p": "w0"}, ended={"a", "p"})
    ordered = Fifo("a", "b")
    decisions = run(layers, ordered, parked=("p",))
    assert dispatched(decisions) == [("b", "w0")]
    assert ordered.items == []
    assert StillParked(()) in decisions


def test_a_policy_whose_take_always_fails_cannot_spin_the_step() -> None:
    layers = Layers({"w0": 5}, {"a": "w0"})
    decisions = run(layers, Fifo("a", broken=True))
    assert dispatched(decisions) == []


def test_no_open_worker_dispatches_nothing() -> None:
    layers = Layers({"w0": 5}, {"a": "w0"})
    assert dispatched(run(layers, Fifo("a"), open_=set())) == []
