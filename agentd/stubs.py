"""`@agentd.agent` and `@agentd.tool`: calls become futures.

    @agentd.agent(stateful=True, max_instances=1)
    class Classifier:
        def classify(self, text: str) -> str: ...

    @agentd.tool
    def search(query: str) -> list[str]: ...

    c = Classifier()              # a stub: instances are created by the runtime, lazily
    label = c.classify(question)  # an agentd.Future, at once
    hits = search(label)          # depends on `label`; runs when it resolves

Directives (NALAR Table 1):
- `stateful`: a session's calls go to one instance, in call order, and never migrate.
- `max_instances` / `min_instances`: the runtime keeps at least min instances and grows
  up to max on demand (a call finds no idle instance); the global controller may also
  provision or kill within these bounds.
- `preemptable`: the name of the method that preempts a running call, or `False`: the
  agent's programs are pinned for the KV layer (never paused while their tools run).
- `batchable`: an instance takes up to `max_batch` (default 8) queued calls at once and
  runs them concurrently (their LLM calls then batch in the engine); otherwise an
  instance executes one method call at a time.
- `resources` ({"CPU": 1, "GPU": 0.5, "memory_mb": 512}): what each instance reserves
  from the run's capacity (its sandbox limits: memory, the CPUs it may use, GPUs only as
  configured), as Ray reserves an actor's resources: an instance that does not fit is
  not provisioned, a kill gives its share back, and an agent whose one instance needs
  more than the run has is an error at its first call. A reservation, not a bound: an
  instance is a thread of its run's sandbox process, so the run's rlimits bound every
  instance together and one may use more than it reserved.
All stubs of a class with the same constructor arguments share its instances (one agent
type); see agentd/instances.py.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any, ParamSpec, TypeVar, cast, overload

from agentd import runtime as rt
from agentd.future import Future
from scheduling.agents.policy import Directives
from scheduling.agents.resources import KEYS

P = ParamSpec("P")
R = TypeVar("R")
RESOURCE_KEYS = frozenset(KEYS)
DEFAULT_MAX_BATCH = Directives().max_batch


class AgentStub:
    """What calling a decorated agent class returns: methods return Futures."""

    def __init__(self, cls: type, directives: Directives, args: tuple[Any, ...],
                 kwargs: dict[str, Any]) -> None:
        self._cls = cls
        self._directives = directives
        self._args, self._kwargs = args, kwargs

    def _type(self) -> str:
        return rt.current().control.agent_type(self._cls, self._args, self._kwargs,
                                               self._directives)

    @property
    def instances(self) -> int:
        return rt.current().control.instances(self._type())

    def __getattr__(self, name: str) -> Callable[..., Future]:
        if name.startswith("_"):
            raise AttributeError(name)
        method = getattr(self._cls, name, None)
        if not callable(method):
            raise AttributeError(f"agent {self._cls.__name__} has no method {name!r}")
        qualname = f"{self._cls.__name__}.{name}"

        @functools.wraps(method)
        def call(*args: Any, **kwargs: Any) -> Future:
            return rt.current().call_agent(self._type(), qualname, name, args, kwargs)

        return call


def as_stub(obj: object) -> AgentStub:
    """`obj` typed as the AgentStub it is. Type checkers see an instance of a decorated
    class as the plain class (they do not apply class decorators); use this to reach
    the stub's `instances`."""
    if not isinstance(obj, AgentStub):
        raise TypeError(f"expected an agentd agent stub, got {type(obj).__name__}")
    return obj


class AgentClass:
    """The decorated class: calling it makes an AgentStub."""

    def __init__(self, cls: type, directives: Directives) -> None:
        self.cls = cls
        self.directives = directives
        functools.update_wrapper(self, cls, updated=())

    def __call__(self, *args: Any, **kwargs: Any) -> AgentStub:
        return AgentStub(self.cls, self.directives, args, kwargs)


def directives(stateful: bool = False, batchable: bool = False,
               preemptable: str | bool | None = None, min_instances: int = 1,
               max_instances: int = 1, resources: Mapping[str, float] | None = None,
               cls: type | None = None, max_batch: int = DEFAULT_MAX_BATCH) -> Directives:
    """Checked directives; ValueError names the directive that does not fit."""
    if isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1:
        raise ValueError(f"max_batch must be an integer >= 1, got {max_batch!r}")
    if not 0 <= min_instances <= max_instances or max_instances < 1:
        raise ValueError(f"need 0 <= min_instances <= max_instances and max_instances >= 1, "
                         f"got min {min_instances}, max {max_instances}")
    if isinstance(preemptable, str) and cls is not None and not callable(
            getattr(cls, preemptable, None)):
        raise ValueError(f"preemptable names {preemptable!r}, which {cls.__name__} lacks")
    res = dict(resources or {})
    for key, value in res.items():
        if key not in RESOURCE_KEYS or not isinstance(value, int | float) or value < 0:
            raise ValueError(f"resources[{key!r}] must be one of {sorted(RESOURCE_KEYS)} "
                             f"with a non-negative number, got {value!r}")
    return Directives(stateful, batchable, preemptable, min_instances, max_instances, res,
                      max_batch)


@overload
def agent(cls: type, /) -> AgentClass: ...


@overload
def agent(*, stateful: bool = False, batchable: bool = False,
          preemptable: str | bool | None = None,
          min_instances: int = 1, max_instances: int = 1,
          resources: Mapping[str, float] | None = None,
          max_batch: int = DEFAULT_MAX_BATCH) -> Callable[[type], AgentClass]: ...


def agent(cls: type | None = None, /, *, stateful: bool = False, batchable: bool = False,
          preemptable: str | bool | None = None, min_instances: int = 1, max_instances: int = 1,
          resources: Mapping[str, float] | None = None, max_batch: int = DEFAULT_MAX_BATCH,
          ) -> AgentClass | Callable[[type], AgentClass]:
    """Class decorator: `@agentd.agent` or `@agentd.agent(stateful=..., ...)`."""
    def wrap(c: type) -> AgentClass:
        return AgentClass(c, directives(stateful, batchable, preemptable, min_instances,
                                        max_instances, resources, c, max_batch))

    return wrap(cls) if cls is not None else wrap


class ToolFunction:
    """The decorated function: calling it returns a Future; `.fn` is the plain function."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn
        functools.update_wrapper(self, fn)

    def __call__(self, *args: Any, **kwargs: Any) -> Future:
        return rt.current().call("tool", self.fn.__name__, self.fn, args, kwargs)


def tool(fn: Callable[P, R]) -> Callable[P, R]:
    """Function decorator: calls run on the runtime's pool and return Futures.

    Typed as the function itself: a Future stands for its value (see `agentd.as_future`).
    """
    return cast(Callable[P, R], ToolFunction(fn))
