"""Per request, the daemon's own part of its wait for a dispatch (bench probe).

The daemon dispatches inside the call that makes a request dispatchable: `Core.submit`
pumps the queue it just joined, a worker's finish pumps the slot it freed. So a request
never waits for a dispatch the daemon knows it could make; what it waits for is the
loop: for its HTTP bytes to be read and its handler to run, or (if no worker took it at
once) for the answer that frees a slot to be read. This records, per request, in the
daemon's clock:
- `arrived`: uvicorn read the whole request (its body too: the client writes headers
  and body apart, and a client at a low priority may be descheduled between the two;
  the bytes may also have waited in the socket for the loop, which the loop watch
  shows);
- `queued`: `queued_at`, the gateway handed it to the core;
- `pump`: the start of the pump that dispatched it;
- `dispatched`: `dispatched_at`;
- `own`: whether its own submit dispatched it (else a later pump: a slot opened);
- `headers`: uvicorn parsed its headers (the loop's first touch of it).
One line `{"req": [arrived, queued, pump, dispatched, own, headers]}` each, written
through a buffer (flushed at exit) so the probe adds no write per request to the loop.
"""

from __future__ import annotations

import json
from contextvars import ContextVar
from typing import IO, Any

# [headers parsed, request complete]: set while uvicorn parses a request's headers, so
# its handler task copies it; completed when the body is in.
ARRIVED: ContextVar[list[float] | None] = ContextVar("probe_arrived", default=None)


class Intake:
    def __init__(self, out: IO[str]) -> None:
        self.out = out
        self.submitting: Any = None  # the program whose submit is running
        self.arrived: list[float] | None = None  # its request's [headers, complete]
        self.pump_started = 0.0
        self.waiting: dict[str, list[float]] = {}  # not dispatched by their submit

    def dispatched(self, req: Any, program: Any) -> None:
        own = self.submitting is program
        arrived = self.arrived if own else self.waiting.pop(req.id, None)
        if arrived is not None and len(arrived) == 2:
            self.out.write(json.dumps({"req": [arrived[1], req.queued_at, self.pump_started,
                                               req.dispatched_at, own, arrived[0]]}) + "\n")


def install_intake(out: IO[str]) -> Intake:
    import time

    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    from daemon.core.core import Core
    from daemon.state import RequestStatus

    intake = Intake(out)
    headers, complete = HttpToolsProtocol.on_headers_complete, HttpToolsProtocol.on_message_complete
    submit, pump, dispatch = Core.submit, Core.pump, Core._dispatch

    def on_headers_complete(self: Any) -> None:
        arrived = [time.time()]
        ARRIVED.set(arrived)
        headers(self)
        if self.cycle is not None:
            self.cycle.probe_arrived = arrived

    def on_message_complete(self: Any) -> None:
        complete(self)
        arrived = getattr(self.cycle, "probe_arrived", None)
        if arrived is not None and len(arrived) == 1:
            arrived.append(time.time())

    def probed_submit(self: Core, program: Any, *args: Any, **kwargs: Any) -> Any:
        intake.submitting, intake.arrived = program, ARRIVED.get()
        try:
            req = submit(self, program, *args, **kwargs)
        finally:
            intake.submitting = None
        if req.status == RequestStatus.QUEUED and intake.arrived is not None:
            intake.waiting[req.id] = intake.arrived
        return req

    def probed_pump(self: Core) -> None:
        if not self._pumping:
            intake.pump_started = time.time()
        pump(self)

    def probed_dispatch(self: Core, req: Any, program: Any, worker: Any) -> None:
        first = req.dispatched_at is None
        dispatch(self, req, program, worker)
        if first:
            intake.dispatched(req, program)

    HttpToolsProtocol.on_headers_complete = on_headers_complete  # type: ignore[method-assign]
    HttpToolsProtocol.on_message_complete = on_message_complete  # type: ignore[method-assign]
    Core.submit = probed_submit  # type: ignore[method-assign]
    Core.pump = probed_pump  # type: ignore[method-assign]
    Core._dispatch = probed_dispatch  # type: ignore[method-assign]
    return intake
