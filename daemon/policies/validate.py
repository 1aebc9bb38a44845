"""Validation of a policy version before it may be activated.

Steps: compile (syntax errors with lines), AST allow-list, restricted exec, interface
check (daemon/policies/interface.py), then a dry run on snapshots with a budget of CPU
time per call, garbage collection left out (daemon/policies/clock.py). A call over its
budget is run once more under a sampler to name the line it spends its time on
(daemon/policies/hotspot.py). Every problem carries a line where one can be named. The
report is what gets stored with the version.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from daemon.policies.clock import cpu_time
from daemon.policies.deadline import deadline
from daemon.policies.hotspot import hot_line
from daemon.policies.interface import find_class
from daemon.policies.layers import Layer
from daemon.policies.sandbox import Problem, SandboxError, error_line, load

__all__ = ["CALL_BUDGET_S", "Report", "dry_run", "filename_for", "load_class", "validate"]

CALL_BUDGET_S = 0.005  # per dry-run call
HARD_LIMIT_S = 1.0  # a call still running after this is interrupted (main thread only)
REPEATS = 3  # a call's time is the best of this many runs: a cold first run does not fail it


@dataclass
class Report:
    ok: bool = True
    errors: list[Problem] = field(default_factory=list)
    timings_ms: dict[str, float] = field(default_factory=dict)
    budget_ms: float = CALL_BUDGET_S * 1000
    class_name: str | None = None
    snapshots: list[str] = field(default_factory=list)
    checked_at: float = field(default_factory=time.time)

    def fail(self, message: str, line: int | None = None) -> None:
        self.ok = False
        self.errors.append(Problem(message, line))

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "errors": [e.to_dict() for e in self.errors],
                "timings_ms": self.timings_ms, "budget_ms": self.budget_ms,
                "max_ms": max(self.timings_ms.values(), default=0.0),
                "class_name": self.class_name, "snapshots": self.snapshots,
                "checked_at": self.checked_at}


def filename_for(name: str, version: int | None) -> str:
    return f"<policy {name} v{version}>" if version is not None else f"<policy {name}>"


def load_class(layer: Layer, name: str, source: str, filename: str) -> type:
    """Exec the source and return its one policy class; SandboxError otherwise."""
    namespace = load(source, filename)
    return find_class(layer, name, namespace, source)


def validate(layer: Layer, name: str, source: str, snapshots: Sequence[tuple[str, Any]],
             now: float, version: int | None = None) -> Report:
    """The full check; never raises for a problem in the policy, only reports it."""
    report = Report()
    filename = filename_for(name, version)
    try:
        cls = load_class(layer, name, source, filename)
        policy = cls()
    except SandboxError as exc:
        for p in exc.problems:
            report.fail(p.message, p.line)
        return report
    except Exception as exc:
        report.fail(f"creating the policy raised {type(exc).__name__}: {exc}",
                    error_line(exc, filename))
        return report
    report.class_name = cls.__name__
    for label, view in snapshots:
        report.snapshots.append(label)
        for call, thunk in layer.dry_calls(view, now):
            dry_run(report, f"{label}:{call}", functools.partial(thunk, policy), filename)
    return report


def dry_run(report: Report, label: str, thunk: Callable[[], str | None],
            filename: str) -> None:
    best = float("inf")
    for _ in range(REPEATS):
        start = cpu_time()
        try:
            with deadline(HARD_LIMIT_S):
                problem = thunk()
        except Exception as exc:
            report.fail(f"{label} raised {type(exc).__name__}: {exc}", error_line(exc, filename))
            return
        best = min(best, cpu_time() - start)
        if problem is not None:
            report.fail(f"{label}: {problem}")
            return
        if best > 10 * CALL_BUDGET_S:
            break  # no point repeating a call that is far over
    report.timings_ms[label] = round(best * 1000, 3)
    if best > CALL_BUDGET_S:
        line = hot_line(thunk, filename)
        where = f" (most of it on line {line})" if line is not None else ""
        report.fail(f"{label} took {best * 1000:.1f} ms of CPU{where}; the budget is "
                    f"{CALL_BUDGET_S * 1000:.1f} ms per call", line)
