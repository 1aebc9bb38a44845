"""Import one module of examples/ by path: the examples are bundles, not packages, and
each has its own main.py."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def load_example(relpath: str) -> ModuleType:
    name = "example_" + relpath.removesuffix(".py").replace("/", "_")
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / relpath)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
