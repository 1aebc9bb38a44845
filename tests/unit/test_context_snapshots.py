"""The per-tenant snapshot store: names per tenant, bounds refused (409), never evicted."""

from __future__ import annotations

import pytest

from daemon.api.context_snapshots import SnapshotStore
from daemon.errors import ApiError


def test_names_are_per_tenant() -> None:
    store = SnapshotStore()
    store.put("a", "docs", "m", [1, 2])
    store.put("b", "docs", "m", [3])
    assert store.get("a", "docs").token_ids == (1, 2)
    assert store.get("b", "docs").token_ids == (3,)
    store.delete("b", "docs")
    with pytest.raises(ApiError) as err:
        store.get("b", "docs")
    assert err.value.status == 404 and err.value.param == "name"
    assert store.get("a", "docs").body()["token_ids"] == [1, 2]


def test_bounds_refuse_instead_of_evicting() -> None:
    store = SnapshotStore(max_count=2, max_tokens=5)
    store.put("a", "x", "m", [1, 2])
    store.put("a", "y", "m", [1, 2])
    store.put("a", "y", "m", [1, 2, 3])  # replacing is not one more
    with pytest.raises(ApiError) as err:
        store.put("a", "z", "m", [1])
    assert err.value.status == 409 and err.value.code == "snapshot_limit"
    with pytest.raises(ApiError) as err:
        store.put("a", "y", "m", [1, 2, 3, 4])
    assert err.value.status == 409
    assert store.get("a", "x").token_ids == (1, 2)  # nothing was evicted
    store.put("b", "z", "m", [1, 2, 3, 4, 5])  # another tenant has its own room
