"""Stopping the TUI's workers before the client they share is closed.

Textual cancels workers on unmount but never waits for them, and under `run_test` the
app is unmounted before its own workers are even cancelled; a worker that runs on
after the client closes fails with httpx's "client has been closed" error.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from textual.worker import Worker, WorkerError, WorkerState
from textual.worker_manager import WorkerManager

SHUTDOWN_WAIT_S = 5.0


async def finish_workers(workers: WorkerManager,
                         timeout: float = SHUTDOWN_WAIT_S) -> list[Worker[Any]]:
    """Cancel every worker and wait until all have ended; returns those still running
    after `timeout` (thread workers cannot be interrupted, only waited for)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    # Repeat: a handler still running during shutdown may start a new worker.
    while running := _running(workers):
        left = deadline - loop.time()
        if left <= 0:
            return running
        for worker in running:
            worker.cancel()
        # asyncio.wait, not gather under a timeout: cancelling a wait on a worker that
        # ignores its cancel would itself hang until that worker ends.
        await asyncio.wait([asyncio.ensure_future(_ended(w)) for w in running], timeout=left)
    return []


def _running(workers: WorkerManager) -> list[Worker[Any]]:
    # A never-started worker has no task to wait for and can send nothing.
    return [w for w in workers if not w.is_finished and w.state is not WorkerState.PENDING]


async def _ended(worker: Worker[Any]) -> None:
    with contextlib.suppress(WorkerError):  # cancelled or failed: either way it has ended
        await worker.wait()
