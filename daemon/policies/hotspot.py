"""Which line of a policy's source a slow call spends its time on.

Run once more under a CPU-time sampling timer (SIGPROF every half millisecond); each
sample counts the line the innermost frame of the policy's own file is on, so time in a
library call counts for the policy line that made it. Signals reach only the main
thread: elsewhere no line is found. The run is cut short after `limit_s`, since a
handful of samples already point at the loop that matters.
"""

from __future__ import annotations

import signal
import threading
from collections import Counter
from collections.abc import Callable
from types import FrameType
from typing import Any

from daemon.policies.deadline import deadline

SAMPLE_S = 0.0005
LIMIT_S = 0.2


def _policy_line(frame: FrameType | None, filename: str) -> int | None:
    while frame is not None:
        if frame.f_code.co_filename == filename:
            return frame.f_lineno
        frame = frame.f_back
    return None


def hot_line(call: Callable[[], Any], filename: str, limit_s: float = LIMIT_S) -> int | None:
    """The line of `filename` that most samples of one run of `call` were on."""
    if threading.current_thread() is not threading.main_thread():
        return None
    samples: Counter[int] = Counter()

    def on_sample(_sig: int, frame: FrameType | None) -> None:
        line = _policy_line(frame, filename)
        if line is not None:
            samples[line] += 1

    previous = signal.signal(signal.SIGPROF, on_sample)
    signal.setitimer(signal.ITIMER_PROF, SAMPLE_S, SAMPLE_S)
    try:
        with deadline(limit_s):
            call()
    except Exception:  # only where the time went matters here (PolicyTimeout included)
        pass
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.signal(signal.SIGPROF, previous)
    return samples.most_common(1)[0][0] if samples else None
