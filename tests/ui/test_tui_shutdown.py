"""The TUI shuts down cleanly whatever its workers are doing when it exits.

The app talks to a real daemon; the only thing between them is `HeldTransport`, the
real network transport with a gate that keeps one chosen request in flight.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from textual.app import App
from textual.worker import Worker, WorkerError, WorkerState

from console.client import AsyncAgentdClient
from console.tui.app import AgentdTui
from console.tui.shutdown import finish_workers
from tests.daemon_process import DaemonProcess
from tests.ui.test_tui import SIZE, until
from tests.waiting import wait_for_async

# Long enough that the poll worker is in its wait whenever a test is not polling.
IDLE_POLL_S = 30.0


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    d = DaemonProcess(tmp_path_factory.mktemp("tui-shutdown") / "data").start()
    yield d
    d.stop()


class HeldTransport(httpx.AsyncBaseTransport):
    """The network, except that once armed, the first request for `path` is answered by
    the daemon but handed back only when the client closes, as a slow reply would be.

    `running_at_close` lists the app's workers that had not finished when the client
    closed: any of them could still send on the closed client.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self.armed = False
        self.held = asyncio.Event()
        self._release = asyncio.Event()
        self._net = httpx.AsyncHTTPTransport()
        self.app: AgentdTui | None = None
        self.running_at_close: list[str] | None = None

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self._net.handle_async_request(request)
        if self.armed and request.url.path == self.path and not self.held.is_set():
            await response.aread()  # answered; only the hand-back is late
            self.held.set()
            await self._release.wait()
        return response

    async def aclose(self) -> None:
        assert self.app is not None
        self.running_at_close = [w.name for w in self.app.workers if not w.is_finished]
        self._release.set()
        await self._net.aclose()


def held_app(d: DaemonProcess, path: str) -> tuple[AgentdTui, HeldTransport]:
    transport = HeldTransport(path)
    client = AsyncAgentdClient(d.url, d.token, timeout=5.0, transport=transport)
    app = AgentdTui(client, poll_interval=0.2)
    transport.app = app
    return app, transport


async def busy(seconds: float) -> None:
    """Hold the app's message loop, as a long redraw does, so its own shutdown lags."""
    await asyncio.sleep(seconds)  # the lag is what is tested, not a wait on anything


# The poll's snapshot sends several requests in turn: holding the second one leaves the
# poll worker about to send the next; the sessions view's worker sends just one.
@pytest.mark.parametrize(("view", "path"), [("1", "/v1/workers"), ("3", "/v1/sessions")])
async def test_exit_while_a_refresh_is_in_flight(daemon: DaemonProcess, view: str,
                                                 path: str) -> None:
    app, transport = held_app(daemon, path)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press(view)
        await until(pilot, lambda: app.snapshot is not None, "first poll")
        transport.armed = True
        await until(pilot, transport.held.is_set, f"a request for {path} in flight")
        app.call_later(busy, 0.5)
    # run_test re-raises what a worker raised during shutdown, so reaching here is half
    # the check; the other half is that no worker was left to send after the close.
    assert transport.running_at_close == []
    assert not list(app.workers)


async def test_poll_now_as_the_app_exits_stops_the_poll(daemon: DaemonProcess) -> None:
    """ctrl+r wakes the poll's wait just as shutdown cancels it, at each step of the wake:
    the cancellation must win, or the poll goes on sending after the client is closed."""
    client = AsyncAgentdClient(daemon.url, daemon.token, timeout=5.0)
    app = AgentdTui(client, poll_interval=IDLE_POLL_S)
    async with app.run_test(size=SIZE) as pilot:
        for steps in range(6):
            app.snapshot = None
            worker = app.poll()
            # The worker posts the snapshot and goes into its wait with no await between:
            # once the snapshot is shown, it waits.
            await until(pilot, lambda: app.snapshot is not None, "a poll")
            app.action_poll_now()
            for _ in range(steps):
                await asyncio.sleep(0)  # one turn of the loop each: the step under test
            worker.cancel()
            await until_finished(worker)
            assert worker.state is WorkerState.CANCELLED, steps


async def test_finish_workers_waits_for_slow_cleanup_and_reports_the_stuck() -> None:
    """A worker whose cancellation takes a while is waited for; one that refuses to end is
    reported rather than waited for forever."""
    app: App[None] = App()
    release = asyncio.Event()
    started: set[str] = set()  # each adds its name, then awaits with no step between

    async def slow_cleanup() -> None:
        started.add("slow")
        try:
            await asyncio.sleep(IDLE_POLL_S)  # runs until cancelled
        except asyncio.CancelledError:
            await asyncio.shield(asyncio.sleep(0.3))  # the slow cleanup under test
            raise

    async def refuses() -> None:
        started.add("refuses")
        while not release.is_set():
            with contextlib.suppress(asyncio.CancelledError):
                await release.wait()

    async with app.run_test():
        slow = app.run_worker(slow_cleanup())
        stubborn = app.run_worker(refuses())
        await wait_for_async(lambda: started == {"slow", "refuses"}, 2, "both workers to run")
        stuck = await finish_workers(app.workers, timeout=1.0)
        assert slow.state is WorkerState.CANCELLED
        assert stuck == [stubborn]
        release.set()
        await until_finished(stubborn)
    assert await finish_workers(app.workers) == []


async def until_finished(worker: Worker[Any]) -> None:
    async with asyncio.timeout(2.0):
        with contextlib.suppress(WorkerError):  # cancelled or failed: it has ended either way
            await worker.wait()
