"""The SLO scheduling modules stay pure: no I/O frameworks and no wall clock."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

MODULES = (
    "prediction", "ordering", "views", "meta", "meta_llm", "admission", "metrics", "templates",
)
FORBIDDEN = {"asyncio", "zmq", "sqlalchemy", "textual", "litestar", "time", "datetime", "random"}
ROOT = Path(__file__).resolve().parents[2] / "scheduling" / "slo"


def _imported_roots(tree: ast.AST) -> set[str]:
    roots: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            roots.add(node.module.split(".")[0])
    return roots


@pytest.mark.parametrize("module", MODULES)
def test_module_imports_nothing_impure(module: str) -> None:
    tree = ast.parse((ROOT / f"{module}.py").read_text())
    assert not _imported_roots(tree) & FORBIDDEN
    assert not {"daemon", "db", "tools", "console", "webui"} & _imported_roots(tree)
