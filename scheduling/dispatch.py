"""The fast timescale's one step: order -> admit -> route -> dispatch (ARCHITECTURE.md).

`dispatch` decides, for the global waiting queue, which requests go to which worker now.
The queue has two parts. *Parked* requests are those the KV policy holds (not admitted
yet, paused, held by an operator): they are retried in arrival order on every step, since
the KV policy decides when they run. The *ordered* part holds the rest in the active
ordering policy's order and is served head first while the head's worker admits it. A
head no open worker admits ends the step: nothing overtakes it, which is what makes the
order matter. A head whose program lives on one full worker waits aside for this step so
the other workers keep serving.

The step is pure: it reads the layers through `Layers` (the admission fence, the KV
policy's placement, where a program's KV lives) and yields its decisions one at a time.
The caller applies each before asking for the next (a dispatch reserves KV, which the
next admission must see), so the daemon owns every effect and the same step runs
wherever the layers do.
"""

from __future__ import annotations

from collections.abc import Generator, Iterable, Iterator
from dataclasses import dataclass
from typing import Literal, Protocol

from scheduling.slo.admission import AdmissionDecision
from scheduling.slo.prediction import QueuedRequest


class Layers(Protocol):
    """What one step asks of the scheduling layers about the requests it considers."""

    def queued(self, request_id: str) -> bool:
        """The request still waits to be dispatched (not ended, not running)."""

    def home(self, request_id: str) -> str | None:
        """The healthy worker holding the request's program's KV, which it must go to."""

    def admits(self, request_id: str, worker: str) -> AdmissionDecision:
        """The stability agent's answer for the request on the worker (no effect)."""

    def route(self, request_id: str, now: float) -> str | None:
        """The KV policy's worker for the request's program (a known one); None holds it
        back (it is parked)."""

    def has_room(self, worker: str) -> bool:
        """The worker is under its concurrency cap N_run."""


class Ordered(Protocol):
    """The ordered part of the queue, as the active ordering policy keeps it."""

    def __len__(self) -> int: ...

    def peek(self, now: float) -> QueuedRequest | None: ...

    def take(self, head: QueuedRequest, now: float) -> bool:
        """Pop `head`; False when the policy popped another (peek again)."""

    def discard(self, request_id: str) -> object: ...

    def push(self, request: QueuedRequest, now: float) -> None: ...


@dataclass(frozen=True, slots=True)
class Dispatch:
    request_id: str
    worker: str


@dataclass(frozen=True, slots=True)
class Refuse:
    """The fence refused the request where it could go (recorded once per request)."""

    request_id: str
    decision: AdmissionDecision


@dataclass(frozen=True, slots=True)
class StillParked:
    """The parked requests that stay parked, in order (once the parked ones are tried)."""

    request_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Park:
    """The KV policy holds the ordered head back: it joins the parked part."""

    request_id: str


Decision = Dispatch | Refuse | StillParked | Park


def dispatch(parked: Iterable[str], ordered: Ordered, open_workers: set[str], layers: Layers,
             now: float) -> Iterator[Decision]:
    """The step's decisions in order; `open_workers` (healthy, under N_run) is narrowed as
    workers fill or refuse. Apply each decision before taking the next."""
    open_ = set(open_workers)
    waiting: list[str] = []  # the parked ones that stay
    yield from _parked(parked, open_, layers, now, waiting)
    yield StillParked(tuple(waiting))
    yield from _ordered(ordered, open_, layers, now)


def _parked(parked: Iterable[str], open_: set[str], layers: Layers, now: float,
            waiting: list[str]) -> Iterator[Decision]:
    for rid in parked:
        if not layers.queued(rid):
            continue
        refusal = _may_start(rid, open_, layers)
        if refusal is not True:
            if refusal is not None:
                yield refusal
            waiting.append(rid)
            continue
        worker = layers.route(rid, now)
        sent = worker is not None and (yield from _send(rid, worker, open_, layers))
        if not sent:
            waiting.append(rid)


def _ordered(ordered: Ordered, open_: set[str], layers: Layers,
             now: float) -> Iterator[Decision]:
    aside: list[QueuedRequest] = []
    # Each pass takes a request or meets a misbehaving policy (take fails, the queue
    # rebuilds); the bound keeps one with nothing to fall back to from spinning the loop.
    passes = 2 * len(ordered) + 4
    while open_ and passes > 0 and (head := ordered.peek(now)) is not None:
        passes -= 1
        rid = head.request_id
        if not layers.queued(rid):
            ordered.discard(rid)
            continue
        refusal = _may_start(rid, open_, layers)
        if refusal is not True:
            if refusal is not None:
                yield refusal
            home = layers.home(rid)
            if home is None:
                break  # strict order: nothing overtakes the head
            open_.discard(home)
            if open_ and ordered.take(head, now):
                aside.append(head)
            continue
        worker = layers.route(rid, now)
        if not ordered.take(head, now):
            continue
        if worker is None:
            yield Park(rid)
        elif not (yield from _send(rid, worker, open_, layers)):
            aside.append(head)
    # Back through push: for a policy with state (WFQ's tags, two-lane's gate) a request
    # set aside counts as arriving again.
    for q in aside:
        ordered.push(q, now)


def _may_start(rid: str, open_: set[str], layers: Layers) -> Literal[True] | Refuse | None:
    """True when an open worker the request could go to admits it (asked before routing,
    so a refusal does not record a KV admission that does not happen); else the refusal
    to record, or None when no open worker was asked."""
    home = layers.home(rid)
    candidates = [home] if home is not None else sorted(open_)
    decision = None
    for worker in candidates:
        if worker not in open_:
            continue
        decision = layers.admits(rid, worker)
        if decision.admit:
            return True
    return None if decision is None else Refuse(rid, decision)


def _send(rid: str, worker: str, open_: set[str], layers: Layers
          ) -> Generator[Decision, None, bool]:
    """Dispatch to the routed worker if it is open and admits the request (it closes when
    it fills); a refusal closes it for this step. Whether the request was sent."""
    decision = layers.admits(rid, worker) if worker in open_ else None
    if decision is None or not decision.admit:
        if decision is not None:
            open_.discard(worker)
            yield Refuse(rid, decision)
        return False
    yield Dispatch(rid, worker)
    if not layers.has_room(worker):
        open_.discard(worker)
    return True

