"""Message delivery between the cluster's local controllers, and the running of calls.

Messages (scheduling/agents/messages.py) queue in `outbox`; with `auto_pump` every send
delivers them at once, in order, and a message with nothing ahead of it skips the
queue. Without, the host (or a test choosing any delivery order) calls `pump` or
`deliver_at`. After a controller handles a message, `_settle` does what the cluster
owns: trace migrations and refusals, pass on what a killed instance was sent, reap it.
The host starts the calls `start_next` returns and reports each with `finish`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from scheduling.agents.local import LocalController, Started
from scheduling.agents.messages import Message, MigrateRequest, Submit, Transfer
from scheduling.agents.placement import Placement
from scheduling.agents.policy import InstanceState
from scheduling.agents.waiting import WAITING_ROOM


class Delivery(Placement):
    """A layer of `Cluster` (cluster.py)."""

    def __init__(self, auto_pump: bool) -> None:
        self.auto_pump = auto_pump
        self.outbox: deque[Message] = deque()

    def send(self, messages: Iterable[Message], now: float) -> None:
        self.outbox.extend(messages)
        if self.auto_pump:
            self.pump(now)

    def _send_one(self, m: Message, now: float) -> None:
        """`send` of one message, without the queue when nothing is ahead of it."""
        if self.auto_pump and not self.outbox:
            self.deliver(m, now)
            if self.outbox:
                self.pump(now)
        else:
            self.send((m,), now)

    def pump(self, now: float) -> None:
        while self.outbox:
            self.deliver(self.outbox.popleft(), now)

    def deliver(self, m: Message, now: float) -> None:
        c = self.controllers[m.to]
        out = c.handle(m, now)
        if not out and not c.refused and c.state_ is InstanceState.ACTIVE:
            return  # the common case, kept short: nothing to log, forward or reap
        self._settle(c, out, m, now)

    def _settle(self, c: LocalController, out: list[Message], m: Message, now: float) -> None:
        """After `c` handled `m`: log migrations and refusals, pass on what a killed
        instance was sent, queue `out` (parking.py adds: end the waits of calls whose
        dependency failed)."""
        for o in out:
            if isinstance(o, Transfer):
                self._visit(o.future.session_id, o.to)
                if c.id != WAITING_ROOM:  # leaving it is a placement, traced as one
                    self._event("future.migrated", id=o.future.future_id, source=c.id,
                                destination=o.to, session_id=o.future.session_id)
        while c.refused:
            fid, why = c.refused.pop()
            self._event("migration.refused", id=fid, instance=c.id, reason=why)
        if c.state_ is not InstanceState.ACTIVE and isinstance(m, Submit | Transfer) \
                and m.future.future_id in c.held and self.alive(c.agent_type):
            # placed or moved here before the kill: pass it on to a live instance
            target = self.place(c.agent_type, m.future.session_id)[0]
            out.append(MigrateRequest(c.id, m.future.future_id, target))
        self.outbox.extend(out)
        self._reap(c)

    def deliver_at(self, index: int, now: float) -> None:
        """Deliver the index-th message in flight (tests: any delivery order)."""
        m = self.outbox[index]
        del self.outbox[index]
        self.deliver(m, now)

    def start_next(self, instance_id: str, now: float) -> Started | None:
        started = self.controllers[instance_id].start_next(now)
        if started is not None and self.record_events:
            self._event("future.started", id=started.future.future_id, instance=instance_id,
                        session_id=started.future.session_id)
        return started

    def startable(self) -> list[str]:
        return [c.id for cs in self.by_type.values() for c in cs if c.has_startable()]

    def finish(self, instance_id: str, fid: str, value: object, ok: bool, now: float) -> None:
        c = self.controllers[instance_id]
        out = c.finish(fid, value, ok, now)
        if len(out) == 1:
            self._send_one(out[0], now)  # the value to its creator alone: the common case
        else:
            self.send(out, now)
        meta = self._meta.get(fid)
        if meta is not None:
            tally = self._tally.get(meta.session)
            if tally is not None:
                self._count(tally, meta.stage, meta.attempt, -1)
        if c.state_ is InstanceState.DRAINING:
            self._reap(c)
