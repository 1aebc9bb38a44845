"""The web UI's only way to the daemon: its public REST API over HTTP, as the user."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import quote

import httpx


class ApiError(Exception):
    """A non-2xx answer from the daemon, with the message its error body carried."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def seg(value: str) -> str:
    """One path segment, percent-encoded (ids may hold '/', '<', spaces...)."""
    return quote(value, safe="")


class Api:
    """One user's view of the daemon, authenticated with that user's API token."""

    def __init__(self, base_url: str, token: str, timeout: float = 10.0) -> None:
        self._client = httpx.AsyncClient(
            base_url=base_url, timeout=timeout,
            headers={"Authorization": f"Bearer {token}", "Accept": "application/json"})

    async def __aenter__(self) -> Api:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._client.aclose()

    async def get(self, path: str, **params: Any) -> Any:
        query = {k: v for k, v in params.items() if v not in (None, "")}
        return self._answer(await self._client.get(path, params=query))

    async def post(self, path: str, body: dict[str, Any] | None = None) -> Any:
        return self._answer(await self._client.post(path, json=body))

    async def put(self, path: str, body: dict[str, Any]) -> Any:
        return self._answer(await self._client.put(path, json=body))

    async def delete(self, path: str) -> Any:
        return self._answer(await self._client.delete(path))

    async def text(self, path: str) -> str:
        response = await self._client.get(path, headers={"Accept": "text/plain"})
        if not response.is_success:
            self._answer(response)
        return response.text

    async def sse(self, path: str) -> AsyncIterator[Any]:
        """The JSON `data:` payloads of a server-sent event stream, until `[DONE]`."""
        async with self._client.stream("GET", path, timeout=httpx.Timeout(
                10.0, read=None), headers={"Accept": "text/event-stream"}) as response:
            if not response.is_success:
                await response.aread()
                self._answer(response)
            async for line in response.aiter_lines():
                if not line.startswith("data:"):
                    continue
                payload = line[5:].strip()
                if payload == "[DONE]":
                    return
                yield json.loads(payload)

    @staticmethod
    def _answer(response: httpx.Response) -> Any:
        if response.is_success:
            return response.json()
        message = response.text[:500]
        try:
            error = response.json().get("error", {})
            message = str(error.get("message", message))
        except (ValueError, AttributeError):
            pass
        raise ApiError(response.status_code, message)

    # --- the endpoints the UI reads ---------------------------------------------------

    async def workers(self) -> list[dict[str, Any]]:
        return list((await self.get("/v1/workers"))["data"])

    async def health(self) -> dict[str, Any]:
        response = await self._client.get("/healthz")
        return dict(response.json())

    async def programs(self, status: str | None = None, session: str | None = None,
                       limit: int = 100, offset: int = 0, sort: str = "created_at",
                       desc: bool = True) -> tuple[list[dict[str, Any]], int]:
        """One page of programs, filtered and sorted by the daemon over all of them."""
        body = await self.get("/v1/programs", status=status, session=session, limit=limit,
                              offset=offset, sort=sort, order="desc" if desc else "asc")
        return list(body["data"]), int(body["total"])

    async def sessions(self, limit: int = 100, offset: int = 0, contains: str = "",
                       tenant: str = "", sort: str = "created_at",
                       desc: bool = True) -> tuple[list[dict[str, Any]], int]:
        """One page of sessions, filtered and sorted by the daemon over all of them."""
        body = await self.get("/v1/sessions", limit=limit, offset=offset, q=contains,
                              tenant=tenant, sort=sort, order="desc" if desc else "asc")
        return list(body["data"]), int(body["total"])

    async def policies(self) -> list[dict[str, Any]]:
        return list((await self.get("/v1/policies"))["data"])

    async def policy(self, name: str) -> dict[str, Any]:
        return dict(await self.get(f"/v1/policies/{seg(name)}"))

    async def policy_version(self, name: str, version: int) -> dict[str, Any]:
        return dict(await self.get(f"/v1/policies/{seg(name)}/versions/{version}"))

    async def policy_diff(self, name: str, a: int, b: int) -> str:
        body = await self.get(f"/v1/policies/{seg(name)}/diff", **{"from": a, "to": b})
        return str(body["diff"])

    async def tools(self) -> list[dict[str, Any]]:
        return list((await self.get("/v1/tools"))["data"])

    async def tools_gc(self, dry_run: bool) -> list[dict[str, Any]]:
        return list((await self.post("/v1/tools/gc", {"dry_run": dry_run}))["data"])

    async def workflows(self) -> list[dict[str, Any]]:
        return list((await self.get("/v1/workflows"))["data"])

    async def runs(self) -> list[dict[str, Any]]:
        return list((await self.get("/v1/runs"))["data"])

    async def run(self, run_id: str) -> dict[str, Any]:
        return dict(await self.get(f"/v1/runs/{seg(run_id)}"))

    async def session(self, session_id: str) -> dict[str, Any]:
        return dict(await self.get(f"/v1/sessions/{seg(session_id)}"))

    async def program(self, program_id: str) -> dict[str, Any]:
        return dict(await self.get(f"/v1/programs/{seg(program_id)}"))

    async def request(self, request_id: str) -> dict[str, Any]:
        return dict(await self.get(f"/v1/requests/{seg(request_id)}"))

    async def worker(self, worker_id: str) -> dict[str, Any]:
        return dict(await self.get(f"/v1/workers/{seg(worker_id)}"))

    async def history(self, series: list[str], since: float, step: float
                      ) -> dict[str, Any]:
        """GET /v1/history: `since` negative is seconds before now."""
        return dict(await self.get("/v1/history", series=",".join(series), since=since,
                                   step=step))

    async def events(self, since: float, limit: int = 100,
                     kinds: tuple[str, ...] = ()) -> list[dict[str, Any]]:
        """GET /v1/events, newest first: `since` negative is seconds before now."""
        body = await self.get("/v1/events", since=since, limit=limit,
                              kind=",".join(kinds))
        return list(body["data"])

    async def release_idle(self, idle_s: float, dry_run: bool) -> dict[str, Any]:
        return dict(await self.post("/v1/programs/release-idle",
                                    {"idle_s": idle_s, "dry_run": dry_run}))

    async def whoami(self) -> dict[str, Any]:
        return dict(await self.get("/v1/whoami"))

    async def trace(self, session_id: str, max_events: int = 5000) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        after = 0
        while len(events) < max_events:
            body = await self.get(f"/v1/sessions/{seg(session_id)}/trace", after=after,
                                  limit=min(1000, max_events - len(events)))
            events.extend(body["data"])
            if body.get("next_after") is None:
                break
            after = int(body["next_after"])
        return events
