"""Stub generation (NALAR §3.1): a short YAML declaration -> an importable stub module.

    agent: developer             # the stub module's name: `import developer`
    class: Developer             # the implementation, an ordinary Python class
    module: developer_impl       # where it lives (default: <agent>_impl)
    directives:                  # NALAR Table 1 (optional)
      max_instances: 4
      batchable: true
    functions:
      - name: implement
        doc: Write code for one subtask.
        params:
          - {name: task, type: str}
          - {name: attempt, type: int, default: 0}
        returns: str

The generated module has one function per declared method: calling it returns an
agentd.Future at once (typed as the declared return, which the Future stands for);
`init(**directives)` overrides directives before the first call, as in the paper's
`planner.init(preemptable=True, ...)`. The implementation class needs no agentd import.
"""

from __future__ import annotations

import ast
import keyword
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from agentd.stubs import directives as check_directives

DIRECTIVES = ("stateful", "batchable", "preemptable", "min_instances", "max_instances",
              "resources", "max_batch")
_TYPE_NODES = (ast.Name, ast.Attribute, ast.Subscript, ast.Tuple, ast.BinOp, ast.BitOr,
               ast.Load, ast.Constant, ast.List)


class StubgenError(ValueError):
    """A declaration that does not fit; the message starts with the field's path."""


@dataclass(frozen=True)
class Param:
    name: str
    type: str
    default: Any = None
    has_default: bool = False


@dataclass(frozen=True)
class Function:
    name: str
    params: tuple[Param, ...]
    returns: str
    doc: str


@dataclass(frozen=True)
class AgentSpec:
    agent: str
    cls: str
    module: str
    directives: dict[str, Any]
    functions: tuple[Function, ...]


def _ident(value: Any, where: str, dotted: bool = False) -> str:
    parts = value.split(".") if isinstance(value, str) and dotted else [value]
    if not isinstance(value, str) or not all(
            isinstance(p, str) and p.isidentifier() and not keyword.iskeyword(p) for p in parts):
        raise StubgenError(f"{where}: {value!r} is not a valid Python "
                           f"{'module path' if dotted else 'identifier'}")
    return value


def _type(value: Any, where: str) -> str:
    text = "Any" if value is None else value
    if not isinstance(text, str):
        raise StubgenError(f"{where}: a type is written as text, e.g. 'list[str]'")
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError:
        raise StubgenError(f"{where}: {text!r} is not a type expression") from None
    if not all(isinstance(n, (ast.Expression, *_TYPE_NODES)) for n in ast.walk(tree)):
        raise StubgenError(f"{where}: {text!r} is not a plain type expression")
    return text


def _mapping(value: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise StubgenError(f"{where}: expected a mapping, got {type(value).__name__}")
    return value


def _param(raw: Any, where: str) -> Param:
    m = _mapping(raw, where)
    unknown = set(m) - {"name", "type", "default"}
    if unknown:
        raise StubgenError(f"{where}: unknown key {sorted(unknown)[0]!r}")
    has_default = "default" in m
    default = m.get("default")
    if has_default and not isinstance(default, str | int | float | bool | type(None)):
        raise StubgenError(f"{where}.default: only str, int, float, bool or null")
    return Param(_ident(m.get("name"), f"{where}.name"), _type(m.get("type"), f"{where}.type"),
                 default, has_default)


def _function(raw: Any, where: str) -> Function:
    m = _mapping(raw, where)
    unknown = set(m) - {"name", "params", "returns", "doc"}
    if unknown:
        raise StubgenError(f"{where}: unknown key {sorted(unknown)[0]!r}")
    name = _ident(m.get("name"), f"{where}.name")
    if name.startswith("_") or name == "init":
        raise StubgenError(f"{where}.name: {name!r} is reserved (private, or the stub's init)")
    raw_params = m.get("params") or []
    if not isinstance(raw_params, list):
        raise StubgenError(f"{where}.params: expected a list")
    params = tuple(_param(p, f"{where}.params[{i}]") for i, p in enumerate(raw_params))
    seen: set[str] = set()
    defaulted = False
    for i, p in enumerate(params):
        if p.name in seen:
            raise StubgenError(f"{where}.params[{i}].name: {p.name!r} appears twice")
        if defaulted and not p.has_default:
            raise StubgenError(f"{where}.params[{i}]: a parameter without a default follows "
                               "one with a default")
        seen.add(p.name)
        defaulted = defaulted or p.has_default
    doc = m.get("doc", "")
    if not isinstance(doc, str):
        raise StubgenError(f"{where}.doc: expected text")
    return Function(name, params, _type(m.get("returns"), f"{where}.returns"), doc)


def parse(text: str) -> AgentSpec:
    """The declaration in `text`; StubgenError names the first field that does not fit."""
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark is not None else ""
        raise StubgenError(f"not valid YAML{at}: {getattr(exc, 'problem', exc)}") from None
    m = _mapping(raw, "declaration")
    unknown = set(m) - {"agent", "class", "module", "directives", "functions"}
    if unknown:
        raise StubgenError(f"{sorted(unknown)[0]}: unknown key; known: agent, class, module, "
                           "directives, functions")
    agent = _ident(m.get("agent"), "agent")
    cls = _ident(m.get("class"), "class")
    module = _ident(m.get("module", f"{agent}_impl"), "module", dotted=True)
    if module == agent:
        raise StubgenError("module: the implementation cannot live in the stub's own module")
    given = dict(_mapping(m.get("directives") or {}, "directives"))
    for key in given:
        if key not in DIRECTIVES:
            raise StubgenError(f"directives.{key}: unknown; known: {', '.join(DIRECTIVES)}")
    try:
        check_directives(**given)
    except (ValueError, TypeError) as exc:
        raise StubgenError(f"directives: {exc}") from None
    raw_fns = m.get("functions")
    if not isinstance(raw_fns, list) or not raw_fns:
        raise StubgenError("functions: declare at least one function")
    fns = tuple(_function(f, f"functions[{i}]") for i, f in enumerate(raw_fns))
    names = [f.name for f in fns]
    for i, n in enumerate(names):
        if n in names[:i]:
            raise StubgenError(f"functions[{i}].name: {n!r} is declared twice")
    return AgentSpec(agent, cls, module, given, fns)


def render(spec: AgentSpec, source: str = "the YAML declaration") -> str:
    """The stub module's source."""
    lines = [
        f'"""Stub for agent {spec.agent!r}: generated by `agentctl stubgen` from {source}.',
        "",
        f"Calls return agentd.Futures and run on instances of {spec.module}.{spec.cls}.",
        'Do not edit: change the declaration and generate again."""',
        "",
        "from __future__ import annotations",
        "",
        "from typing import Any",
        "",
        "import agentd",
        "",
        f"DIRECTIVES: dict[str, Any] = {spec.directives!r}",
        "_agent: Any = None",
        "",
        "",
        "def init(**directives: Any) -> None:",
        '    """Override directives (stateful, batchable, preemptable, min_instances,',
        '    max_instances, resources); takes effect for calls made after it."""',
        "    global _agent",
        f"    from {spec.module} import {spec.cls} as impl  # imported at first use",
        "",
        "    DIRECTIVES.update(directives)",
        "    _agent = agentd.agent(**DIRECTIVES)(impl)()",
        "",
        "",
        "def _instance() -> Any:",
        "    if _agent is None:",
        "        init()",
        "    return _agent",
    ]
    for f in spec.functions:
        params = ", ".join(
            f"{p.name}: {p.type}" + (f" = {p.default!r}" if p.has_default else "")
            for p in f.params)
        call = ", ".join(p.name for p in f.params)
        lines += ["", "", f"def {f.name}({params}) -> {f.returns}:"]
        if f.doc:
            lines.append(f"    {f.doc.strip()!r}")
        # the Future stands for the declared type (see agentd.as_future)
        ignore = "" if f.returns == "Any" else "  # type: ignore[no-any-return]"
        lines.append(f"    return _instance().{f.name}({call}){ignore}")
    return "\n".join(lines) + "\n"


def generate(text: str, source: str = "the YAML declaration") -> tuple[str, str]:
    """(module name, module source) for the declaration in `text`."""
    spec = parse(text)
    out = render(spec, source)
    ast.parse(out)  # a generator bug must not write a broken module
    return spec.agent, out
