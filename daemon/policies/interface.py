"""The interface check: a policy's source defines exactly one subclass of its layer's
interface, with the layer's methods and `name` set to the policy's name.

Each problem names the line it is about: the extra class, the class that lacks a
method, or the `name = ...` line (the class line when there is none).
"""

from __future__ import annotations

import ast
from typing import Any

from daemon.policies.layer_spec import Layer
from daemon.policies.sandbox import Problem, SandboxError


def _lines(source: str | None) -> dict[str, tuple[int, int | None]]:
    """Class name -> (its line, the line of its `name = ...`) for top-level classes."""
    if source is None:
        return {}
    out: dict[str, tuple[int, int | None]] = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.ClassDef):
            out[node.name] = (node.lineno, _name_line(node))
    return out


def _name_line(cls: ast.ClassDef) -> int | None:
    for stmt in cls.body:
        targets = stmt.targets if isinstance(stmt, ast.Assign) else (
            [stmt.target] if isinstance(stmt, ast.AnnAssign) else [])
        if any(isinstance(t, ast.Name) and t.id == "name" for t in targets):
            return stmt.lineno
    return None


def find_class(layer: Layer, name: str, namespace: dict[str, Any],
               source: str | None = None) -> type:
    """The source's one policy class; SandboxError with every problem otherwise."""
    found = [v for v in namespace.values() if isinstance(v, type)
             and issubclass(v, layer.interface) and v.__module__ == namespace["__name__"]]
    lines = _lines(source)
    iface = layer.interface.__name__
    if len(found) != 1:
        listed = ", ".join(c.__name__ for c in found) or "none"
        line = lines.get(found[1].__name__, (None, None))[0] if len(found) > 1 else None
        raise SandboxError([Problem(f"the source must define exactly one subclass of {iface}; "
                                    f"found {len(found)} ({listed})", line)])
    cls = found[0]
    class_line, name_line = lines.get(cls.__name__, (None, None))
    problems = [Problem(f"{cls.__name__} does not define {m}()", class_line)
                for m in layer.methods if not callable(getattr(cls, m, None))]
    abstract = sorted(getattr(cls, "__abstractmethods__", ()))
    if abstract:
        problems.append(Problem(f"{cls.__name__} leaves abstract: {', '.join(abstract)}",
                                class_line))
    declared = getattr(cls, "name", None)
    if declared != name:
        got = declared if isinstance(declared, str) else None  # not the base's property
        problems.append(Problem(f"{cls.__name__}.name must be {name!r}, got {got!r}",
                                name_line or class_line))
    if problems:
        raise SandboxError(problems)
    return cls
