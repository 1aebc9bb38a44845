"""Polling for a condition a real daemon reaches in its own time."""

from __future__ import annotations

import time
from collections.abc import Callable
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
