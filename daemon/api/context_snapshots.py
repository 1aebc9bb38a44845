"""Named context snapshots: token-id prefixes a tenant's programs reuse (tool documentation,
a repository summary), kept per tenant, so another tenant's name is simply unknown.

A snapshot is only the ids: its KV is the engine's prefix cache, reached again by any
generate that starts with them. They live in the daemon's memory (a restart forgets them;
a program opens them again after re-creating them), bounded per tenant in count and in
tokens; a full tenant is refused (409), never silently evicted.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Annotated, Any

import msgspec
from litestar import Request

from daemon.errors import ApiError

MAX_SNAPSHOTS_PER_TENANT = 256
MAX_TOKENS_PER_TENANT = 4 << 20
_STATE_KEY = "agentd.snapshots"
TokenId = Annotated[int, msgspec.Meta(ge=0, le=2**31 - 1)]


class SnapshotIn(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    model: str
    token_ids: Annotated[list[TokenId], msgspec.Meta(max_length=1 << 20)]
    tenant: str | None = None  # operator tokens only, as everywhere
    # The program taking the snapshot, for its trace (`context.snapshot`); none: untraced
    # to a session.
    program_id: str | None = None
    session_id: str | None = None


@dataclass(frozen=True)
class Snapshot:
    name: str
    model: str
    token_ids: tuple[int, ...]
    created_at: float

    def summary(self) -> dict[str, Any]:
        return {"name": self.name, "model": self.model, "tokens": len(self.token_ids),
                "created_at": self.created_at}

    def body(self) -> dict[str, Any]:
        return {**self.summary(), "token_ids": list(self.token_ids)}


class SnapshotStore:
    def __init__(self, max_count: int = MAX_SNAPSHOTS_PER_TENANT,
                 max_tokens: int = MAX_TOKENS_PER_TENANT) -> None:
        self.max_count, self.max_tokens = max_count, max_tokens
        self._by_tenant: dict[str, dict[str, Snapshot]] = {}
        self._lock = threading.Lock()

    def put(self, tenant: str, name: str, model: str, token_ids: list[int]) -> Snapshot:
        """Keep (or replace) `name`; 409 when the tenant's bounds would be passed."""
        snapshot = Snapshot(name, model, tuple(token_ids), time.time())
        with self._lock:
            held = self._by_tenant.setdefault(tenant, {})
            others = [s for n, s in held.items() if n != name]
            if len(others) >= self.max_count:
                raise _full(f"tenant '{tenant}' holds {len(others)} snapshots, the limit")
            tokens = sum(len(s.token_ids) for s in others) + len(token_ids)
            if tokens > self.max_tokens:
                raise _full(f"tenant '{tenant}' would hold {tokens} snapshot tokens; the "
                            f"limit is {self.max_tokens}")
            held[name] = snapshot
        return snapshot

    def get(self, tenant: str, name: str) -> Snapshot:
        with self._lock:
            snapshot = self._by_tenant.get(tenant, {}).get(name)
        if snapshot is None:
            raise _unknown(name)
        return snapshot

    def delete(self, tenant: str, name: str) -> None:
        with self._lock:
            if self._by_tenant.get(tenant, {}).pop(name, None) is None:
                raise _unknown(name)


def of(request: Request[Any, Any, Any]) -> SnapshotStore:
    """The app's store, made on first use."""
    store = request.app.state.get(_STATE_KEY)
    if not isinstance(store, SnapshotStore):
        store = SnapshotStore()
        request.app.state[_STATE_KEY] = store
    return store


def _unknown(name: str) -> ApiError:
    return ApiError(404, f"unknown snapshot '{name}'", "not_found", param="name")


def _full(why: str) -> ApiError:
    return ApiError(409, f"{why}; delete a snapshot first (DELETE "
                    "/v1/contexts/snapshots/{name})", "snapshot_limit", param="token_ids")
