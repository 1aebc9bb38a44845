"""Validation of a policy version before it may be activated.

Steps: compile (syntax errors with lines), AST allow-list, restricted exec, interface
check (exactly one subclass of the layer's interface, its methods present, `name` set
to the policy's name), then a dry run on snapshots with a time budget per call. The
report is what gets stored with the version.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

from daemon.policies.layers import Layer
from daemon.policies.sandbox import Problem, SandboxError, error_line, load

CALL_BUDGET_S = 0.005  # per dry-run call
HARD_LIMIT_S = 1.0  # a call still running after this is interrupted (main thread only)
REPEATS = 3  # a call's time is the best of this many runs, so one GC pause does not fail it


class PolicyTimeout(Exception):
    """Raised inside a policy call that ran past its hard limit."""


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
    return find_class(layer, name, namespace)


def find_class(layer: Layer, name: str, namespace: dict[str, Any]) -> type:
    found = [v for v in namespace.values() if isinstance(v, type)
             and issubclass(v, layer.interface) and v.__module__ == namespace["__name__"]]
    iface = layer.interface.__name__
    if len(found) != 1:
        listed = ", ".join(c.__name__ for c in found) or "none"
        raise SandboxError([Problem(f"the source must define exactly one subclass of {iface}; "
                                    f"found {len(found)} ({listed})")])
    cls = found[0]
    problems = [Problem(f"{cls.__name__} does not define {m}()")
                for m in layer.methods if not callable(getattr(cls, m, None))]
    abstract = sorted(getattr(cls, "__abstractmethods__", ()))
    if abstract:
        problems.append(Problem(f"{cls.__name__} leaves abstract: {', '.join(abstract)}"))
    if getattr(cls, "name", None) != name:
        problems.append(Problem(f"{cls.__name__}.name must be {name!r}, "
                                f"got {getattr(cls, 'name', None)!r}"))
    if problems:
        raise SandboxError(problems)
    return cls


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
            dry_run(report, f"{label}:{call}", lambda t=thunk: t(policy), filename)
    return report


def dry_run(report: Report, label: str, thunk: Any, filename: str) -> None:
    best = float("inf")
    for _ in range(REPEATS):
        start = time.perf_counter()
        try:
            with deadline(HARD_LIMIT_S):
                problem = thunk()
        except Exception as exc:
            report.fail(f"{label} raised {type(exc).__name__}: {exc}", error_line(exc, filename))
            return
        best = min(best, time.perf_counter() - start)
        if problem is not None:
            report.fail(f"{label}: {problem}")
            return
        if best > 10 * CALL_BUDGET_S:
            break  # no point repeating a call that is far over
    report.timings_ms[label] = round(best * 1000, 3)
    if best > CALL_BUDGET_S:
        report.fail(f"{label} took {best * 1000:.1f} ms; the budget is "
                    f"{CALL_BUDGET_S * 1000:.1f} ms per call")


@contextlib.contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """Interrupt the block with PolicyTimeout after `seconds` (SIGALRM; main thread only,
    elsewhere the block simply runs to completion and is timed afterwards)."""
    if threading.current_thread() is not threading.main_thread() or seconds <= 0:
        yield
        return
    armed = [True]

    def on_alarm(_sig: int, _frame: FrameType | None) -> None:
        if armed[0]:
            raise PolicyTimeout(f"still running after {seconds:.3f} s")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        armed[0] = False
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
