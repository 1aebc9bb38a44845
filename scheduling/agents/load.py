"""Least-loaded placement without a pass over the instances: the live instances of one
agent type, bucketed by load (the calls each holds).

A local controller's load moves by one per event, so an instance moves to a
neighbouring bucket and the lowest non-empty bucket is found again by stepping from
where it was: O(1) per change and per pick. Within a bucket the instance that reached
that load first comes first, so equal loads are served round-robin.
"""

from __future__ import annotations


class LoadIndex:
    __slots__ = ("_buckets", "_load", "_low")

    def __init__(self) -> None:
        self._buckets: dict[int, dict[str, None]] = {}  # load -> instances, in arrival order
        self._load: dict[str, int] = {}
        self._low = 0  # the lowest load with an instance; meaningless when empty

    def __len__(self) -> int:
        return len(self._load)

    def __contains__(self, instance_id: object) -> bool:
        return instance_id in self._load

    def add(self, instance_id: str, load: int) -> None:
        if instance_id in self._load:
            self.set(instance_id, load)
            return
        self._load[instance_id] = load
        self._put(instance_id, load)
        if len(self._load) == 1 or load < self._low:
            self._low = load

    def remove(self, instance_id: str) -> None:
        load = self._load.pop(instance_id, None)
        if load is None:
            return
        self._drop(instance_id, load)
        if self._buckets and load == self._low and load not in self._buckets:
            self._low = min(self._buckets)  # rare (a kill): as many steps as loads in use

    def set(self, instance_id: str, load: int) -> None:
        old = self._load.get(instance_id)
        if old is None or old == load:
            return
        self._load[instance_id] = load
        buckets = self._buckets
        was = buckets[old]  # _drop and _put written out: this runs twice per call
        del was[instance_id]
        if not was:
            del buckets[old]
        bucket = buckets.get(load)
        if bucket is None:
            buckets[load] = {instance_id: None}
        else:
            bucket[instance_id] = None
        if load < self._low:
            self._low = load
        elif old == self._low and old not in self._buckets:
            low = old + 1  # the bucket at `load` is not empty: at most load - old steps
            while low not in self._buckets:
                low += 1
            self._low = low

    def least(self) -> tuple[str, int] | None:
        """The instance with the least load, and that load."""
        if not self._load:
            return None
        return next(iter(self._buckets[self._low])), self._low

    def _put(self, instance_id: str, load: int) -> None:
        bucket = self._buckets.get(load)
        if bucket is None:
            bucket = self._buckets[load] = {}
        bucket[instance_id] = None

    def _drop(self, instance_id: str, load: int) -> None:
        bucket = self._buckets[load]
        del bucket[instance_id]
        if not bucket:
            del self._buckets[load]
