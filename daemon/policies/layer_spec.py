"""What the registry needs to know about one scheduling layer.

A layer names its interface class, the methods a policy must have, its built-ins, how
to dry-run a policy on a snapshot, and how the daemon runs it: the live snapshot to
validate against, how to put a version in charge at start (returning its `Guard`), and
which built-in the config starts with. Taking the live snapshot must not hold the event
loop (issue 8: no dispatch stall over 10 ms during a swap), hence `build`. Adding a
layer is one `Layer` in `LAYERS` (daemon/policies/layers.py); the registry, validation
and the API are generic over them.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any

# One dry-run call: (label, thunk taking the policy instance and returning a problem or None)
DryCall = tuple[str, Callable[[Any], str | None]]


def _no_tuning(_name: str, _core: Any) -> dict[str, Any]:
    return {}


@dataclass(frozen=True)
class Layer:
    name: str
    interface: type
    methods: tuple[str, ...]
    builtins: Mapping[str, Callable[..., Any]]
    dry_calls: Callable[[Any, float], list[DryCall]]
    # A fixed snapshot, so a policy is exercised even when the daemon is idle.
    sample: Callable[[float], Any]
    # The daemon's live snapshot: live(core). It runs on the event loop, so it must stay
    # cheap; a layer whose snapshot walks a long window returns a copy of what the walk
    # reads and names the walk as `build`: a coroutine function that walks it in steps
    # on the loop, or a plain function, run in a worker thread.
    live: Callable[[Any], Any]
    # Put a version in charge at start: install(core, active, on_failure) -> Guard.
    install: Callable[[Any, Any, Callable[[Any], None]], Any]
    # The built-in to activate when the store has none: default(config) -> name.
    default: Callable[[Any], str]
    # Constructor arguments of a built-in from the daemon's config: tuning(name, core).
    tuning: Callable[[str, Any], dict[str, Any]] = _no_tuning
    # Where the built-ins' source is (default: each factory's own module).
    source_module: ModuleType | None = None
    # Turns what `live` copied into the dry run's snapshot without holding the loop
    # (None: as is).
    build: Callable[[Any], Any] | None = None

    def builtin(self, name: str, core: Any) -> Any:
        return self.builtins[name](**self.tuning(name, core))

    def builtin_source(self, name: str) -> str:
        factory = self.builtins[name]
        return inspect.getsource(self.source_module or inspect.getmodule(factory) or factory)
