"""Polling for a condition a real daemon reaches in its own time."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any


def wait_for(check: Callable[[], Any], timeout: float, what: str, interval: float = 0.1) -> Any:
    """The first truthy value `check` returns; AssertionError naming `what` after `timeout`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out waiting for {what}")


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
