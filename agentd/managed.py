"""Managed state: a dict and a list that the runtime keeps for the session.

    history = agentd.ManagedList("history")      # the session's list named "history"
    prefs = agentd.ManagedDict("prefs", {"lang": "en"})  # initial value if none is stored

They are real `dict` / `list` subclasses. The name is the key in the session's state.
Persistence (daemon mode): the value is loaded from the session's state when the object
is created, and written through to the daemon after EVERY mutating call (one HTTP PUT of
the whole value), so a crash loses at most the mutation in flight. Values must be JSON
(TypeError names what is not). Local mode keeps the values in the process's runtime.
Two objects with the same name in one process do not see each other's later mutations;
create one per name.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Any, SupportsIndex, TypeVar

from agentd import runtime as rt

F = TypeVar("F", bound=Callable[..., Any])


def _check_name(name: str) -> str:
    if not (isinstance(name, str) and 0 < len(name) <= 128 and name.replace("_", "a")
            .replace("-", "a").replace(".", "a").isalnum()):
        raise ValueError(f"managed state name must be 1-128 of [A-Za-z0-9_.-], got {name!r}")
    return name


def _saving(method: F) -> F:
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = method(self, *args, **kwargs)
        self._save()
        return result

    wrapper.__name__ = method.__name__
    wrapper.__doc__ = method.__doc__
    return wrapper  # type: ignore[return-value]


class ManagedDict(dict[str, Any]):
    """A dict whose contents live in the session's managed state under `name`."""

    def __init__(self, name: str, initial: dict[str, Any] | None = None) -> None:
        self.name = _check_name(name)
        stored = rt.current().load_state(name)
        if stored is not None and not isinstance(stored, dict):
            raise TypeError(f"session state {name!r} holds a {type(stored).__name__}, not a dict")
        super().__init__(stored if stored is not None else (initial or {}))
        if stored is None and initial:
            self._save()

    def _save(self) -> None:
        _json_check(self.name, self)
        rt.current().save_state(self.name, dict(self))

    __setitem__ = _saving(dict.__setitem__)
    __delitem__ = _saving(dict.__delitem__)
    __ior__ = _saving(dict.__ior__)
    update = _saving(dict.update)
    pop = _saving(dict.pop)
    popitem = _saving(dict.popitem)
    clear = _saving(dict.clear)
    setdefault = _saving(dict.setdefault)

    def __reduce__(self) -> Any:
        return (dict, (dict(self),))


class ManagedList(list[Any]):
    """A list whose contents live in the session's managed state under `name`."""

    def __init__(self, name: str, initial: Iterable[Any] | None = None) -> None:
        self.name = _check_name(name)
        stored = rt.current().load_state(name)
        if stored is not None and not isinstance(stored, list):
            raise TypeError(f"session state {name!r} holds a {type(stored).__name__}, not a list")
        super().__init__(stored if stored is not None else list(initial or []))
        if stored is None and initial:
            self._save()

    def _save(self) -> None:
        _json_check(self.name, self)
        rt.current().save_state(self.name, list(self))

    __setitem__ = _saving(list.__setitem__)
    __delitem__ = _saving(list.__delitem__)
    __iadd__ = _saving(list.__iadd__)
    __imul__ = _saving(list.__imul__)
    append = _saving(list.append)
    extend = _saving(list.extend)
    insert = _saving(list.insert)
    remove = _saving(list.remove)
    clear = _saving(list.clear)
    sort = _saving(list.sort)
    reverse = _saving(list.reverse)

    def pop(self, index: SupportsIndex = -1) -> Any:
        value = list.pop(self, index)
        self._save()
        return value

    def __reduce__(self) -> Any:
        return (list, (list(self),))


def _json_check(name: str, value: Any) -> None:
    try:
        json.dumps(value)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"managed state {name!r} must hold JSON values: {exc}") from exc
