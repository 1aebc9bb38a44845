"""Restricted compile and exec of policy source.

A best-effort guard against mistakes, not a security boundary: only operators may
store policies. The AST check refuses imports outside an allow-list, the dangerous
builtins and dunder attribute access; the exec gets a trimmed builtins dict whose
`__import__` enforces the same allow-list (and refuses `from x import <module>`
of a module outside it).
"""

from __future__ import annotations

import ast
import builtins
import types
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

ALLOWED_MODULES = frozenset({"math", "dataclasses", "typing", "collections", "heapq",
                             "itertools", "functools", "__future__", "enum", "abc"})
ALLOWED_PREFIXES = ("scheduling.", "collections.")
FORBIDDEN_NAMES = frozenset({
    "open", "eval", "exec", "compile", "__import__", "globals", "locals", "vars",
    "getattr", "setattr", "delattr", "breakpoint", "input", "memoryview", "help",
    "__builtins__", "__loader__", "__spec__", "exit", "quit",
})
# Attribute names that lead from an allowed object to the interpreter's internals.
FORBIDDEN_ATTRS = frozenset({
    "format", "format_map", "gi_frame", "gi_code", "f_globals", "f_locals", "f_back",
    "f_builtins", "tb_frame", "cr_frame", "ag_frame", "co_code", "sys", "os", "modules",
    "builtins", "subprocess", "socket", "importlib",
})
ALLOWED_DUNDERS = frozenset({"__init__", "__post_init__", "__name__", "__future__"})
_SAFE_BUILTINS = (
    "abs", "all", "any", "bool", "dict", "divmod", "enumerate", "filter", "float",
    "frozenset", "hash", "int", "isinstance", "issubclass", "iter", "len", "list", "map",
    "max", "min", "next", "object", "print", "property", "range", "repr", "reversed",
    "round", "set", "slice", "sorted", "staticmethod", "classmethod", "str", "sum", "super",
    "tuple", "type", "zip", "None", "True", "False", "NotImplemented", "Ellipsis",
    "Exception", "ValueError", "KeyError", "TypeError", "RuntimeError", "IndexError",
    "ArithmeticError", "ZeroDivisionError", "StopIteration", "AssertionError",
    "AttributeError", "NotImplementedError", "__build_class__",
)


@dataclass(frozen=True)
class Problem:
    message: str
    line: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"message": self.message, "line": self.line}


class SandboxError(Exception):
    def __init__(self, problems: Sequence[Problem]) -> None:
        super().__init__("; ".join(_fmt(p) for p in problems))
        self.problems = list(problems)


def _fmt(p: Problem) -> str:
    return f"line {p.line}: {p.message}" if p.line is not None else p.message


def module_allowed(name: str) -> bool:
    return name in ALLOWED_MODULES or name == "scheduling" or name.startswith(ALLOWED_PREFIXES)


def parse(source: str, filename: str) -> ast.Module:
    try:
        return ast.parse(source, filename=filename)
    except SyntaxError as exc:
        raise SandboxError([Problem(f"syntax error: {exc.msg}", exc.lineno)]) from exc


def check_ast(tree: ast.Module) -> list[Problem]:
    """Every forbidden import, name and attribute in the tree, with its line."""
    problems: list[Problem] = []
    for node in ast.walk(tree):
        problem = _check_node(node)
        if problem is not None:
            problems.append(Problem(problem, getattr(node, "lineno", None)))
    return problems


def _check_node(node: ast.AST) -> str | None:
    if isinstance(node, ast.Import):
        bad = [a.name for a in node.names if not module_allowed(a.name)]
        return f"import of {', '.join(bad)} is not allowed" if bad else None
    if isinstance(node, ast.ImportFrom):
        module = node.module or ""
        if node.level or not module_allowed(module):
            return f"import from {'.' * node.level}{module} is not allowed"
        return None
    if isinstance(node, ast.Name) and node.id in FORBIDDEN_NAMES:
        return f"use of {node.id!r} is not allowed"
    if isinstance(node, ast.Attribute):
        attr = node.attr
        if attr in FORBIDDEN_ATTRS or (_is_dunder(attr) and attr not in ALLOWED_DUNDERS):
            return f"access to attribute {attr!r} is not allowed"
    if isinstance(node, ast.Name) and _is_dunder(node.id) and node.id not in ALLOWED_DUNDERS:
        return f"use of {node.id!r} is not allowed"
    return None


def _is_dunder(name: str) -> bool:
    return name.startswith("__") and name.endswith("__")


def _guarded_import(name: str, globals_: Mapping[str, Any] | None = None,
                    locals_: Mapping[str, Any] | None = None,
                    fromlist: Sequence[str] | None = (), level: int = 0) -> types.ModuleType:
    if level or not module_allowed(name):
        raise ImportError(f"import of {name!r} is not allowed in a policy")
    module = builtins.__import__(name, globals_, locals_, fromlist or (), 0)
    for attr in fromlist or ():
        value = getattr(module, attr, None)
        if isinstance(value, types.ModuleType) and not module_allowed(value.__name__):
            raise ImportError(f"importing module {value.__name__!r} is not allowed in a policy")
    return module


def restricted_builtins() -> dict[str, Any]:
    safe = {name: getattr(builtins, name) for name in _SAFE_BUILTINS}
    safe["__import__"] = _guarded_import
    return safe


def load(source: str, filename: str) -> dict[str, Any]:
    """Check and exec `source`; returns its namespace. Raises SandboxError with lines."""
    tree = parse(source, filename)
    problems = check_ast(tree)
    if problems:
        raise SandboxError(problems)
    namespace: dict[str, Any] = {"__builtins__": restricted_builtins(),
                                 "__name__": filename}
    try:
        exec(compile(tree, filename, "exec"), namespace)
    except Exception as exc:
        raise SandboxError([Problem(f"executing the module raised {type(exc).__name__}: "
                                    f"{exc}", error_line(exc, filename))]) from exc
    return namespace


def error_line(exc: BaseException, filename: str) -> int | None:
    """The last line of `filename` in the exception's traceback."""
    line = None
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == filename:
            line = tb.tb_lineno
        tb = tb.tb_next
    if line is None and isinstance(exc, SyntaxError) and exc.filename == filename:
        line = exc.lineno
    return line
