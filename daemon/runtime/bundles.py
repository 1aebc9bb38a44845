"""Workflow bundles: validated, versioned source trees under `<data dir>/workflows/NAME/vN/`.

Each version directory holds the files and `manifest.json` (name, version, entry, files,
entry signature, sha256, created_at, and `tools` when the bundle declares tool specs:
see bundle_tools.py). A version directory appears by one rename of a
fully written temporary directory, so a failed validation or write registers nothing.
"""

from __future__ import annotations

import ast
import hashlib
import json
import re
import shutil
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

MAX_BUNDLE_BYTES = 1024 * 1024
MAX_FILES = 200
MANIFEST = "manifest.json"
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
ENTRY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$")


class BundleError(ValueError):
    """A bundle that cannot be registered; `param` names the field, for the API's error."""

    def __init__(self, message: str, param: str, code: str = "invalid_bundle") -> None:
        super().__init__(message)
        self.param = param
        self.code = code


@dataclass(frozen=True)
class Signature:
    """The entry function's parameters, read from the source (never by importing it)."""

    params: list[str]
    required: list[str]
    var_kwargs: bool
    is_async: bool

    def check(self, args: dict[str, Any]) -> None:
        """Raise BundleError naming the first argument that does not fit."""
        for name in args:
            if name not in self.params and not self.var_kwargs:
                raise BundleError(f"unknown argument '{name}': the entry takes "
                                  f"({', '.join(self.params) or 'no arguments'})",
                                  f"args.{name}", "bad_argument")
        for name in self.required:
            if name not in args:
                raise BundleError(f"missing argument '{name}' (required by the entry)",
                                  f"args.{name}", "bad_argument")

    def to_dict(self) -> dict[str, Any]:
        return {"params": self.params, "required": self.required,
                "var_kwargs": self.var_kwargs, "is_async": self.is_async}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Signature:
        return cls(list(d["params"]), list(d["required"]), bool(d["var_kwargs"]),
                   bool(d["is_async"]))


def _check_path(path: str) -> PurePosixPath:
    p = PurePosixPath(path)
    if (not path or p.is_absolute() or any(part in ("", ".", "..") for part in p.parts)
            or "\\" in path or len(path) > 200 or not path.isprintable()
            or p.name == MANIFEST):
        raise BundleError(f"invalid file path {path!r}: use a relative path without '..'",
                          f"files.{path}")
    return p


def validate(name: str, files: dict[str, str], entry: str) -> Signature:
    """Check a bundle without running any of it; returns the entry's signature."""
    if not NAME_RE.match(name):
        raise BundleError(f"invalid workflow name {name!r}: 1-64 of [A-Za-z0-9_.-], "
                          "starting with a letter or digit", "name")
    if not files:
        raise BundleError("a bundle needs at least one file", "files")
    if len(files) > MAX_FILES:
        raise BundleError(f"too many files ({len(files)} > {MAX_FILES})", "files")
    size = sum(len(text.encode()) for text in files.values())
    if size > MAX_BUNDLE_BYTES:
        raise BundleError(f"bundle is {size} bytes; the limit is {MAX_BUNDLE_BYTES}", "files",
                          "bundle_too_large")
    trees: dict[str, ast.Module] = {}
    for path, text in files.items():
        p = _check_path(path)
        if p.suffix != ".py":
            continue
        try:
            trees[path] = ast.parse(text, filename=path)
            compile(trees[path], path, "exec")
        except SyntaxError as exc:
            raise BundleError(f"syntax error in {path} line {exc.lineno}: {exc.msg}",
                              f"files.{path}", "syntax_error") from exc
        except ValueError as exc:  # e.g. NUL bytes
            raise BundleError(f"{path} does not compile: {exc}", f"files.{path}",
                              "syntax_error") from exc
    if not ENTRY_RE.match(entry):
        raise BundleError(f"invalid entry {entry!r}: expected 'module:function'", "entry")
    module, func = entry.split(":")
    base = module.replace(".", "/")
    source = next((c for c in (f"{base}.py", f"{base}/__init__.py") if c in trees), None)
    if source is None:
        raise BundleError(f"entry module '{module}' is not in the bundle (expected "
                          f"{base}.py)", "entry", "missing_entry")
    for node in trees[source].body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == func:
            return _signature(node)
        if isinstance(node, ast.ClassDef | ast.Assign) and func in _bound_names(node):
            break
    raise BundleError(f"entry function '{func}' is not a top-level function of {source}",
                      "entry", "missing_entry")


def _bound_names(node: ast.stmt) -> set[str]:
    if isinstance(node, ast.ClassDef):
        return {node.name}
    if isinstance(node, ast.Assign):
        return {t.id for t in node.targets if isinstance(t, ast.Name)}
    return set()


def _signature(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> Signature:
    a = fn.args
    if a.posonlyargs:
        raise BundleError(f"entry '{fn.name}' has positional-only parameters; arguments are "
                          "passed by name", "entry")
    positional = [x.arg for x in a.args]
    n_required = len(positional) - len(a.defaults)
    required = positional[:n_required]
    required += [x.arg for x, d in zip(a.kwonlyargs, a.kw_defaults, strict=True) if d is None]
    return Signature(positional + [x.arg for x in a.kwonlyargs], required,
                     a.kwarg is not None, isinstance(fn, ast.AsyncFunctionDef))


class BundleStore:
    def __init__(self, root: Path) -> None:
        self.root = root
        self._lock = threading.Lock()

    def register(self, name: str, files: dict[str, str], entry: str,
                 tools: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
        """`tools`: tool specs already checked by `bundle_tools.check_tools`."""
        signature = validate(name, files, entry)
        digest = hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()
        with self._lock:
            wf = self.root / name
            wf.mkdir(parents=True, exist_ok=True)
            version = max(self._versions(name), default=0) + 1
            tmp = wf / f".tmp-{uuid.uuid4().hex}"
            try:
                for path, text in files.items():
                    target = tmp / path
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_text(text)
                manifest = {"name": name, "version": version, "entry": entry,
                            "files": sorted(files), "signature": signature.to_dict(),
                            "sha256": digest, "created_at": time.time()}
                if tools:
                    manifest["tools"] = tools
                (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2))
                tmp.rename(wf / f"v{version}")
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
        return manifest

    def _versions(self, name: str) -> list[int]:
        wf = self.root / name
        if not wf.is_dir():
            return []
        return sorted(int(p.name[1:]) for p in wf.iterdir()
                      if p.name.startswith("v") and p.name[1:].isdigit()
                      and (p / MANIFEST).is_file())

    def manifest(self, name: str, version: int | None = None) -> dict[str, Any] | None:
        if not NAME_RE.match(name):
            return None
        versions = self._versions(name)
        if not versions:
            return None
        v = versions[-1] if version is None else version
        if v not in versions:
            return None
        data: dict[str, Any] = json.loads((self.root / name / f"v{v}" / MANIFEST).read_text())
        return data

    def path(self, name: str, version: int) -> Path:
        return self.root / name / f"v{version}"

    def list(self) -> list[dict[str, Any]]:
        if not self.root.is_dir():
            return []
        out = []
        for wf in sorted(self.root.iterdir()):
            versions = self._versions(wf.name) if wf.is_dir() else []
            if versions:
                latest = self.manifest(wf.name, versions[-1])
                assert latest is not None
                out.append({"name": wf.name, "versions": versions, "latest": latest})
        return out


class TenantBundles:
    """Workflow names are per tenant: tenant T's bundles are a BundleStore of their own
    under `<root>/T/`, so two tenants may both register `etl` and each runs its own.
    Tenant names cannot be `.` or `..` (daemon/access/names.py), so each is a plain
    directory name. Bundles stored before tenants (`<root>/NAME/vN/`) move to the default
    tenant's namespace at the first start (`adopt_untenanted`), as their sessions did."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._stores: dict[str, BundleStore] = {}

    def of(self, tenant: str) -> BundleStore:
        store = self._stores.get(tenant)
        if store is None:
            store = self._stores[tenant] = BundleStore(self.root / tenant)
        return store

    def workflows(self, tenant: str | None) -> list[dict[str, Any]]:
        """One tenant's workflows, or (None) every tenant's; each names its tenant."""
        if tenant is not None:
            return [wf | {"tenant": tenant} for wf in self.of(tenant).list()]
        if not self.root.is_dir():
            return []
        tenants = sorted(p.name for p in self.root.iterdir()
                         if p.is_dir() and not p.name.startswith("."))
        return [wf for t in tenants for wf in self.workflows(t)]

    def adopt_untenanted(self, tenant: str) -> list[str]:
        """Move bundles of the old layout (`<root>/NAME/vN/manifest.json`) under `tenant`;
        returns the names moved. A name `tenant` already holds is left where it is."""
        if not self.root.is_dir():
            return []
        moved = []
        for wf in sorted(self.root.iterdir()):
            if not any((v / MANIFEST).is_file() for v in wf.glob("v*")):
                continue
            target = self.root / tenant / wf.name
            if target.exists():
                continue
            # Through a temporary name: the old bundle may itself be named `tenant`.
            tmp = self.root / f".adopt-{uuid.uuid4().hex}"
            wf.rename(tmp)
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp.rename(target)
            moved.append(wf.name)
        return moved
