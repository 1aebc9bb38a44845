"""Shared helpers of the benchmark scripts: timing a batch of replays and saving rows."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).parent / "results"
TRACES = Path("/work/shared/traces")


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def save(name: str, params: dict[str, Any], results: list[dict[str, Any]]) -> Path:
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps({"params": params, "results": results}, indent=2) + "\n")
    return path


class Stopwatch:
    def __init__(self) -> None:
        self.start = time.perf_counter()

    def elapsed(self) -> float:
        return time.perf_counter() - self.start
