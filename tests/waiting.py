"""Polling for a condition a real daemon reaches in its own time.

Tests wait on a fact (a trace event, a status, a metric, a process gone),
never on a fixed sleep: a sleep "long enough for X" either waits for nothing or hides a
race on a slower machine."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tests.daemon_process import DaemonProcess

Event = dict[str, Any]


def wait_for(check: Callable[[], Any], timeout: float, what: str | Callable[[], str],
             interval: float = 0.1) -> Any:
    """The first truthy value `check` returns; AssertionError naming `what` after `timeout`
    (a callable `what` is asked then, to say what it saw last)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out waiting for {what() if callable(what) else what}")


async def wait_for_async(check: Callable[[], Any], timeout: float,
                         what: str | Callable[[], str], interval: float = 0.02,
                         pause: Callable[[float], Awaitable[Any]] = asyncio.sleep) -> Any:
    """`wait_for` inside an event loop: the loop runs between checks (`pause`, e.g. a
    Textual pilot's, is how it waits)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        await pause(interval)
    raise AssertionError(f"timed out waiting for {what() if callable(what) else what}")


def session_trace(d: DaemonProcess, session: str, limit: int = 5000) -> list[Event]:
    """The session's trace events, oldest first; none while the session is unknown."""
    r = d.get(f"/v1/sessions/{session}/trace", params={"limit": limit})
    return list(r.json()["data"]) if r.status_code == 200 else []


def wait_for_trace(d: DaemonProcess, session: str, kind: str, timeout: float = 15.0,
                   count: int = 1, where: Callable[[Event], bool] = lambda e: True,
                   ) -> list[Event]:
    """The session's whole trace once it holds `count` events of `kind` for which `where`
    holds. The trace endpoint flushes the batched writer first, so an event the daemon has
    recorded is there at once: what this waits for is the daemon getting that far."""
    def enough() -> list[Event]:
        events = session_trace(d, session)
        found = sum(1 for e in events if e["kind"] == kind and where(e))
        return events if found >= count else []

    return list(wait_for(enough, timeout, lambda: (
        f"{count} '{kind}' event(s) in session {session}'s trace; it holds "
        f"{[e['kind'] for e in session_trace(d, session)][-30:]}")))


def wait_for_exit(pid: int, timeout: float, what: str) -> None:
    """Until no process `pid` exists (a zombie counts as gone: it runs nothing)."""
    def gone() -> bool:
        try:
            with open(f"/proc/{pid}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()[0] == "Z"
        except (FileNotFoundError, ProcessLookupError):
            return True

    wait_for(gone, timeout, what)
