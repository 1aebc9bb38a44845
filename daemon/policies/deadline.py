"""Interrupting a policy call that runs too long (SIGALRM; main thread only)."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType


class PolicyTimeout(Exception):
    """Raised inside a policy call that ran past its hard limit."""


@contextlib.contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """Interrupt the block with PolicyTimeout after `seconds` (SIGALRM; main thread only,
    elsewhere the block simply runs to completion and is timed afterwards)."""
    if threading.current_thread() is not threading.main_thread() or seconds <= 0:
        yield
        return
    armed = [True]

    def on_alarm(_sig: int, _frame: FrameType | None) -> None:
        if armed[0]:
            raise PolicyTimeout(f"still running after {seconds:.3f} s")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        armed[0] = False
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
