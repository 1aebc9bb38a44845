"""Messages between local controllers (NALAR Fig. 8). Each names its receiver in `to`.

A host delivers them (in order in one process; any order in the property test): the
protocol must not depend on delivery order, only on every message arriving once.

Messages are never changed once sent, yet not frozen: a frozen dataclass sets each field
through object.__setattr__, about 1 µs more per message, and a call sends several.
"""

from __future__ import annotations

from dataclasses import dataclass

from scheduling.agents.policy import FutureView

# (dependency id, its value, True unless the dependency failed)
DepValue = tuple[str, object, bool]


@dataclass(slots=True)
class Submit:
    """The creator hands a new call to the executor it was placed on."""

    to: str
    future: FutureView
    dep_at: tuple[tuple[str, str], ...]  # where the creator last saw each dependency


@dataclass(slots=True)
class AddConsumer:
    """To a dependency's executor: push your value to `consumer`, which runs at `at`."""

    to: str
    dep: str
    consumer: str
    at: str


@dataclass(slots=True)
class Value:
    """Push-based readiness: a finished call's value; `consumer` None is its creator."""

    to: str
    dep: str
    consumer: str | None
    value: object
    ok: bool = True
    hops: int = 0  # the consumer's hop this value is meant for


@dataclass(slots=True)
class MigrateRequest:
    """From the global controller to the source: move this not-yet-started call."""

    to: str
    future_id: str
    destination: str


@dataclass(slots=True)
class MigrateSession:
    """From the global controller to the source: move the session's calls of this agent
    type, and with `with_state` its state once no call of it runs here any more."""

    to: str
    session_id: str
    agent_type: str
    destination: str
    with_state: bool


@dataclass(slots=True)
class Redirect:
    """Source to a dependency's executor: if you have not sent the value to `consumer`
    yet, send it to `destination` instead."""

    to: str
    dep: str
    consumer: str
    destination: str
    reply_to: str
    hops: int  # the consumer's hop at the destination


@dataclass(slots=True)
class RedirectReply:
    to: str
    dep: str
    consumer: str
    redirected: bool  # False: the value was already sent here; wait for it


@dataclass(slots=True)
class ExecutorChanged:
    """To the creator, which addresses later registrations to the new executor."""

    to: str
    future_id: str
    executor: str


@dataclass(slots=True)
class Transfer:
    """The call itself, with the dependency values that reached the source, the ones
    still to come (redirected to the destination), and who consumes its value."""

    to: str
    future: FutureView
    values: tuple[DepValue, ...]
    pending: tuple[str, ...]
    dep_at: tuple[tuple[str, str], ...]
    consumers: tuple[tuple[str, tuple[str, int]], ...]
    notes: tuple[tuple[str, tuple[str, int]], ...]


@dataclass(slots=True)
class StateTransfer:
    to: str
    session_id: str
    agent_type: str
    state: object
    has_state: bool


Message = (Submit | AddConsumer | Value | MigrateRequest | MigrateSession | Redirect
           | RedirectReply | ExecutorChanged | Transfer | StateTransfer)
