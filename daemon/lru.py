"""A bounded least-recently-used map, for caches that would otherwise grow with the
daemon's history (every session it ever served)."""

from __future__ import annotations

from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")

# Session ids (and their tenants) a daemon remembers having stored. A forgotten one
# costs a read of its row, or an insert the store ignores, the next time it is named.
SESSIONS_REMEMBERED = 100_000


class Lru(Generic[K, V]):
    """At most `cap` entries; reading or writing one makes it the most recent, and
    adding one past the cap drops the least recent. A dict keeps insertion order, so
    re-inserting an entry on use is the whole recency list."""

    def __init__(self, cap: int) -> None:
        if cap < 1:
            raise ValueError(f"an LRU cache holds at least 1 entry, got cap={cap}")
        self.cap = cap
        self._items: dict[K, V] = {}

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: object) -> bool:
        """Membership only: does not make the entry more recent."""
        return key in self._items

    def get(self, key: K) -> V | None:
        if key not in self._items:
            return None
        value = self._items[key] = self._items.pop(key)
        return value

    def setdefault(self, key: K, value: V) -> V:
        """The entry's value, adding `value` when it has none (as dict.setdefault)."""
        if key in self._items:
            kept = self._items[key] = self._items.pop(key)
            return kept
        self._items[key] = value
        if len(self._items) > self.cap:
            del self._items[next(iter(self._items))]
        return value

    def pop(self, key: K) -> V | None:
        """Remove the entry and return its value; None when there is none."""
        return self._items.pop(key, None)
