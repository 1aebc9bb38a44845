"""`agentd.Future`: the value of an agent or tool call, transparent once it is used.

A Future stands in for its value: `str(f)`, `len(f)`, `f[0]`, `f + 1`, `if f:`,
`f"{f}"`, iteration and attribute access all wait for the value and then act on it.
It also carries NALAR's metadata: who created it, who executes it, which futures it
depends on and which consume it, its status and timings. The value never changes once
set; executor and consumers may.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

ALL = "ALL_COMPLETED"
FIRST = "FIRST_COMPLETED"

PENDING = "pending"  # waiting for its dependencies
RUNNING = "running"
DONE = "done"
FAILED = "failed"

_ids = itertools.count(1)
_OWN = frozenset({
    "id", "kind", "name", "creator", "executor", "consumers", "dependencies", "status",
    "created_at", "started_at", "finished_at", "_cond", "_value", "_error", "_callbacks",
})


class DependencyError(RuntimeError):
    """A call could not run because a future it depends on failed."""


def new_future_id(prefix: str = "fut") -> str:
    return f"{prefix}-{next(_ids)}"


class Future:
    """One call's result with its dependency metadata; see the module docstring."""

    __slots__ = tuple(sorted(_OWN))

    def __init__(self, kind: str, name: str, creator: str, executor: str | None = None,
                 dependencies: Iterable[str] = (), fid: str | None = None) -> None:
        self.id = fid or new_future_id()
        self.kind = kind  # agent | tool | llm
        self.name = name
        self.creator = creator
        self.executor = executor
        self.dependencies: list[str] = list(dependencies)
        self.consumers: list[str] = []
        self.status = PENDING
        self.created_at = time.time()
        self.started_at: float | None = None
        self.finished_at: float | None = None
        self._cond = threading.Condition()
        self._value: Any = None
        self._error: BaseException | None = None
        self._callbacks: list[Callable[[Future], None]] = []

    # --- state ------------------------------------------------------------------------

    def available(self) -> bool:
        """True once the value (or the error) is set; never blocks."""
        return self.status in (DONE, FAILED)

    def value(self, timeout: float | None = None) -> Any:
        """The value, waiting up to `timeout` seconds (TimeoutError); re-raises a failure."""
        with self._cond:
            if not self._cond.wait_for(self.available, timeout):
                raise TimeoutError(f"future {self.id} ({self.name}) not resolved "
                                   f"after {timeout}s")
        if self._error is not None:
            raise self._error
        return self._value

    def exception(self, timeout: float | None = None) -> BaseException | None:
        with self._cond:
            if not self._cond.wait_for(self.available, timeout):
                raise TimeoutError(f"future {self.id} ({self.name}) not resolved "
                                   f"after {timeout}s")
        return self._error

    def mark_running(self, executor: str | None = None) -> None:
        with self._cond:
            self.status = RUNNING
            self.started_at = time.time()
            if executor is not None:
                self.executor = executor

    def set_result(self, value: Any) -> None:
        self._finish(DONE, value, None)

    def set_exception(self, error: BaseException) -> None:
        self._finish(FAILED, None, error)

    def _finish(self, status: str, value: Any, error: BaseException | None) -> None:
        with self._cond:
            if self.available():
                raise RuntimeError(f"future {self.id} is already resolved")
            self._value, self._error = value, error
            self.finished_at = time.time()
            self.status = status
            callbacks, self._callbacks = self._callbacks, []
            self._cond.notify_all()
        for callback in callbacks:
            callback(self)

    def add_done_callback(self, callback: Callable[[Future], None]) -> None:
        """Call `callback(self)` once resolved (at once if it already is)."""
        with self._cond:
            if not self.available():
                self._callbacks.append(callback)
                return
        callback(self)

    def metadata(self) -> dict[str, Any]:
        return {"id": self.id, "kind": self.kind, "name": self.name, "creator": self.creator,
                "executor": self.executor, "dependencies": list(self.dependencies),
                "consumers": list(self.consumers), "status": self.status,
                "created_at": self.created_at, "started_at": self.started_at,
                "finished_at": self.finished_at,
                "error": None if self._error is None else
                f"{type(self._error).__name__}: {self._error}"}

    def __repr__(self) -> str:
        return f"<agentd.Future {self.id} {self.name} {self.status}>"

    # --- transparency: using the value materialises it ---------------------------------

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in _OWN:
            raise AttributeError(name)
        return getattr(self.value(), name)

    def __str__(self) -> str:
        return str(self.value())

    def __format__(self, spec: str) -> str:
        return format(self.value(), spec)

    def __bool__(self) -> bool:
        return bool(self.value())

    def __len__(self) -> int:
        return len(self.value())

    def __iter__(self) -> Iterator[Any]:
        return iter(self.value())

    def __contains__(self, item: object) -> bool:
        return item in self.value()

    def __getitem__(self, key: Any) -> Any:
        return self.value()[key]

    def __int__(self) -> int:
        return int(self.value())

    def __float__(self) -> float:
        return float(self.value())

    def __index__(self) -> int:
        return int(self.value().__index__())

    # Identity hash: futures go into sets (agentd.wait) long before their values exist.
    __hash__ = object.__hash__

    def __eq__(self, other: object) -> bool:
        return bool(self.value() == resolve(other))

    def __ne__(self, other: object) -> bool:
        return bool(self.value() != resolve(other))

    def __lt__(self, other: Any) -> bool:
        return bool(self.value() < resolve(other))

    def __le__(self, other: Any) -> bool:
        return bool(self.value() <= resolve(other))

    def __gt__(self, other: Any) -> bool:
        return bool(self.value() > resolve(other))

    def __ge__(self, other: Any) -> bool:
        return bool(self.value() >= resolve(other))

    def __add__(self, other: Any) -> Any:
        return self.value() + resolve(other)

    def __radd__(self, other: Any) -> Any:
        return resolve(other) + self.value()

    def __sub__(self, other: Any) -> Any:
        return self.value() - resolve(other)

    def __rsub__(self, other: Any) -> Any:
        return resolve(other) - self.value()

    def __mul__(self, other: Any) -> Any:
        return self.value() * resolve(other)

    def __rmul__(self, other: Any) -> Any:
        return resolve(other) * self.value()

    def __truediv__(self, other: Any) -> Any:
        return self.value() / resolve(other)

    def __rtruediv__(self, other: Any) -> Any:
        return resolve(other) / self.value()

    def __floordiv__(self, other: Any) -> Any:
        return self.value() // resolve(other)

    def __rfloordiv__(self, other: Any) -> Any:
        return resolve(other) // self.value()

    def __mod__(self, other: Any) -> Any:
        return self.value() % resolve(other)

    def __rmod__(self, other: Any) -> Any:
        return resolve(other) % self.value()

    def __pow__(self, other: Any) -> Any:
        return self.value() ** resolve(other)

    def __rpow__(self, other: Any) -> Any:
        return resolve(other) ** self.value()

    def __neg__(self) -> Any:
        return -self.value()

    def __pos__(self) -> Any:
        return +self.value()

    def __abs__(self) -> Any:
        return abs(self.value())


def resolve(obj: Any) -> Any:
    """`obj` with every Future inside it (lists, tuples, sets, dict values) replaced
    by its value."""
    if isinstance(obj, Future):
        return resolve(obj.value())
    if isinstance(obj, list):
        return [resolve(x) for x in obj]
    if isinstance(obj, tuple):
        return tuple(resolve(x) for x in obj)
    if isinstance(obj, set | frozenset):
        return type(obj)(resolve(x) for x in obj)
    if isinstance(obj, dict):
        return {k: resolve(v) for k, v in obj.items()}
    return obj


def find_futures(obj: Any, out: list[Future] | None = None) -> list[Future]:
    """Every Future inside `obj` (same containers as `resolve`), each once, in order."""
    found: list[Future] = [] if out is None else out
    if isinstance(obj, Future):
        if all(f is not obj for f in found):
            found.append(obj)
    elif isinstance(obj, list | tuple | set | frozenset):
        for x in obj:
            find_futures(x, found)
    elif isinstance(obj, dict):
        for x in obj.values():
            find_futures(x, found)
    return found


def as_future(obj: Any) -> Future:
    """`obj` typed as a Future. Type checkers see a decorated call's declared return type
    (the value a Future stands for); use this to reach a call's metadata."""
    if not isinstance(obj, Future):
        raise TypeError(f"expected an agentd.Future, got {type(obj).__name__}")
    return obj


def wait(futures: Iterable[Any], timeout: float | None = None,
         return_when: str = ALL) -> tuple[set[Future], set[Future]]:
    """Wait for all (ALL) or any (FIRST) of `futures`; returns (done, not_done).

    Like concurrent.futures.wait: a timeout does not raise, the caller looks at not_done.
    Accepts the values of decorated calls as typed (see `as_future`).
    """
    if return_when not in (ALL, FIRST):
        raise ValueError(f"return_when must be agentd.ALL or agentd.FIRST, not {return_when!r}")
    pending = [as_future(f) for f in futures]
    wake = threading.Event()
    for f in pending:
        f.add_done_callback(lambda _f: wake.set())
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        done = {f for f in pending if f.available()}
        if len(done) == len(pending) or (return_when == FIRST and done):
            return done, {f for f in pending if not f.available()}
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            return done, {f for f in pending if not f.available()}
        wake.wait(left)
        wake.clear()
