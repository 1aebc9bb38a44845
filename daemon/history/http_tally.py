"""Counts the API's 5xx answers (503: no worker yet, draining, the store down...), which
no trace records, for the history's `http_5xx_per_s` and the event log."""

from __future__ import annotations

from collections.abc import Callable

from litestar.enums import ScopeType
from litestar.types import ASGIApp, Message, Receive, Scope, Send


class HttpTally:
    def __init__(self) -> None:
        self.errors_5xx = 0
        self.on_error: Callable[[int], None] | None = None  # set once the daemon runs

    def middleware(self, app: ASGIApp) -> ASGIApp:
        """An ASGI middleware that watches each answer's status line."""

        async def watch(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] != ScopeType.HTTP:
                await app(scope, receive, send)
                return

            async def sending(message: Message) -> None:
                if message["type"] == "http.response.start":
                    self._answered(int(message["status"]))
                await send(message)

            await app(scope, receive, sending)

        return watch

    def _answered(self, status: int) -> None:
        if status < 500:
            return
        self.errors_5xx += 1
        if self.on_error is not None:
            self.on_error(status)


