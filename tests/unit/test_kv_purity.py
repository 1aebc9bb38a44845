"""scheduling/ stays pure: the same code must run under the daemon's wall clock and
the simulator's virtual clock, so it may not reach for I/O or real time."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "scheduling"
FORBIDDEN = {
    "asyncio", "zmq", "sqlalchemy", "textual", "litestar", "time", "socket", "threading",
    "subprocess", "aiosqlite", "httpx", "docker", "daemon", "db", "tools", "console", "webui",
}

IO_LIBRARIES = {"asyncio", "zmq", "sqlalchemy", "textual", "litestar"}


def _modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def _imported_roots(path: Path) -> set[str]:
    roots: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
    return roots


def _dotted(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_module_imports_no_io(path: Path) -> None:
    assert _imported_roots(path) & FORBIDDEN == set()


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_module_imports_cleanly(path: Path) -> None:
    module = importlib.import_module(_dotted(path))
    assert module.__name__ == _dotted(path)


def test_checker_sees_forbidden_imports(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("import asyncio\nfrom sqlalchemy.orm import Session\nimport time as t\n")
    assert _imported_roots(bad) & FORBIDDEN == {"asyncio", "sqlalchemy", "time"}


def test_scheduling_loads_no_io_modules_transitively() -> None:
    # A fresh interpreter: this test process may already hold asyncio for pytest.
    names = [_dotted(p) for p in _modules()]
    script = f"import sys\nfor n in {names!r}: __import__(n)\nprint(' '.join(sys.modules))"
    out = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    assert {n.split(".")[0] for n in out} & IO_LIBRARIES == set()
