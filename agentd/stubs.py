"""`@agentd.agent` and `@agentd.tool`: calls become futures.

    @agentd.agent(stateful=True, max_instances=1)
    class Classifier:
        def classify(self, text: str) -> str: ...

    @agentd.tool
    def search(query: str) -> list[str]: ...

    c = Classifier()              # a stub: instances are created by the runtime, lazily
    label = c.classify(question)  # an agentd.Future, at once
    hits = search(label)          # depends on `label`; runs when it resolves

Directives (NALAR table 1, the subset implemented here):
- `max_instances`: at most this many instances of the class per stub; a call goes to an
  idle instance, a new one while fewer than max exist, else waits for the least busy.
- `stateful`: every call of the stub goes to the same instance, in call order
  (one session per run, so "same session -> same instance" is "one instance").
An instance executes one method call at a time.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable, Iterator
from typing import Any, ParamSpec, TypeVar, cast, overload

from agentd import runtime as rt
from agentd.future import Future

P = ParamSpec("P")
R = TypeVar("R")


class _Instance:
    def __init__(self, index: int, obj: Any) -> None:
        self.index = index
        self.obj = obj
        self.lock = threading.Lock()
        self.queued = 0


class AgentStub:
    """What calling a decorated agent class returns: methods return Futures."""

    def __init__(self, cls: type, directives: dict[str, Any], args: tuple[Any, ...],
                 kwargs: dict[str, Any]) -> None:
        self._cls = cls
        self._directives = directives
        self._args, self._kwargs = args, kwargs
        self._instances: list[_Instance] = []
        self._pick_lock = threading.Lock()
        self._turn = threading.Condition()  # stateful: calls run in the order they were made
        self._next_ticket = 0
        self._serving = 0

    @property
    def instances(self) -> int:
        return len(self._instances)

    def __getattr__(self, name: str) -> Callable[..., Future]:
        if name.startswith("_"):
            raise AttributeError(name)
        method = getattr(self._cls, name, None)
        if not callable(method):
            raise AttributeError(f"agent {self._cls.__name__} has no method {name!r}")
        qualname = f"{self._cls.__name__}.{name}"

        @functools.wraps(method)
        def call(*args: Any, **kwargs: Any) -> Future:
            ticket = self._take_ticket()
            return rt.current().call("agent", qualname,
                                     lambda: self._place(name, ticket), args, kwargs)

        return call

    def _take_ticket(self) -> int:
        with self._turn:
            ticket = self._next_ticket
            self._next_ticket += 1
            return ticket

    def _choose(self) -> _Instance:
        with self._pick_lock:
            limit = 1 if self._directives["stateful"] else self._directives["max_instances"]
            idle = [i for i in self._instances if i.queued == 0]
            if idle:
                chosen = idle[0]
            elif len(self._instances) < limit:
                chosen = _Instance(len(self._instances), None)
                self._instances.append(chosen)
            else:
                chosen = min(self._instances, key=lambda i: i.queued)
            chosen.queued += 1
            return chosen

    @contextlib.contextmanager
    def _place(self, method: str, ticket: int) -> Iterator[rt.Placement]:
        stateful = self._directives["stateful"]
        if stateful:
            with self._turn:
                self._turn.wait_for(lambda: self._serving == ticket)
        inst = self._choose()
        try:
            with inst.lock:
                if inst.obj is None:
                    inst.obj = self._cls(*self._args, **self._kwargs)
                executor = f"{self._cls.__name__}#{inst.index}"
                yield executor, getattr(inst.obj, method), f"{self._cls.__name__}.{inst.index}"
        finally:
            with self._pick_lock:
                inst.queued -= 1
            if stateful:
                with self._turn:
                    self._serving += 1
                    self._turn.notify_all()


class AgentClass:
    """The decorated class: calling it makes an AgentStub."""

    def __init__(self, cls: type, stateful: bool, max_instances: int) -> None:
        if max_instances < 1:
            raise ValueError(f"max_instances must be at least 1, got {max_instances}")
        self.cls = cls
        self.directives = {"stateful": stateful, "max_instances": max_instances}
        functools.update_wrapper(self, cls, updated=())

    def __call__(self, *args: Any, **kwargs: Any) -> AgentStub:
        return AgentStub(self.cls, self.directives, args, kwargs)


@overload
def agent(cls: type, /) -> AgentClass: ...


@overload
def agent(*, stateful: bool = False, max_instances: int = 1) -> Callable[[type], AgentClass]: ...


def agent(cls: type | None = None, /, *, stateful: bool = False,
          max_instances: int = 1) -> AgentClass | Callable[[type], AgentClass]:
    """Class decorator: `@agentd.agent` or `@agentd.agent(stateful=..., max_instances=...)`."""
    if cls is not None:
        return AgentClass(cls, stateful, max_instances)
    return lambda c: AgentClass(c, stateful, max_instances)


class ToolFunction:
    """The decorated function: calling it returns a Future; `.fn` is the plain function."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn
        functools.update_wrapper(self, fn)

    def __call__(self, *args: Any, **kwargs: Any) -> Future:
        name = self.fn.__name__

        @contextlib.contextmanager
        def place() -> Iterator[rt.Placement]:
            yield f"tool:{name}", self.fn, None

        return rt.current().call("tool", name, place, args, kwargs)


def tool(fn: Callable[P, R]) -> Callable[P, R]:
    """Function decorator: calls run on the runtime's pool and return Futures.

    Typed as the function itself: a Future stands for its value (see `agentd.as_future`).
    """
    return cast(Callable[P, R], ToolFunction(fn))
