"""Validation of operator policy source: syntax, imports, interface, time budget."""

from __future__ import annotations

import time

import pytest

from daemon.policies.layers import LAYERS, sample_kv_view
from daemon.policies.sandbox import SandboxError, load
from daemon.policies.validate import Report, validate

GOOD = """\
from scheduling.kv.baselines import least_loaded
from scheduling.kv.policy import KvPolicy


class Canary(KvPolicy):
    name = "canary"

    def decide(self, view, now):
        return []

    def route(self, view, program_id, now):
        return least_loaded(view)
"""


def check(source: str, name: str = "canary") -> Report:
    now = time.time()
    return validate(LAYERS["kv"], name, source, [("sample", sample_kv_view(now))], now, 2)


def messages(report: Report) -> list[tuple[int | None, str]]:
    return [(e.line, e.message) for e in report.errors]


def test_a_sound_policy_passes_with_timings() -> None:
    report = check(GOOD)
    assert report.ok, messages(report)
    assert report.class_name == "Canary"
    assert "sample:decide" in report.timings_ms
    assert "sample:route(p-new)" in report.timings_ms
    assert max(report.timings_ms.values()) < report.budget_ms


def test_syntax_error_reports_its_line() -> None:
    report = check(GOOD.replace("return []", "return [", 1))
    assert not report.ok
    [(line, message)] = messages(report)
    assert line == 9 and "syntax error" in message


@pytest.mark.parametrize(("snippet", "word"), [
    ("import os", "os"),
    ("from subprocess import run", "subprocess"),
    ("import socket as s", "socket"),
    ("from . import thing", "import from"),
])
def test_forbidden_imports_are_refused_with_line(snippet: str, word: str) -> None:
    report = check(snippet + "\n" + GOOD)
    assert not report.ok
    assert (1, next(m for _, m in messages(report))) in messages(report)
    assert word in messages(report)[0][1]


@pytest.mark.parametrize("expr", [
    "open('/etc/passwd').read()", "eval('1')", "exec('x = 1')", "__import__('os')",
    "().__class__.__subclasses__()", "'{0.__class__}'.format(1)", "getattr(view, 'x')",
])
def test_forbidden_calls_and_dunders_are_refused(expr: str) -> None:
    source = GOOD.replace("        return []", f"        {expr}\n        return []")
    report = check(source)
    assert not report.ok
    assert any(line == 9 for line, _ in messages(report)), messages(report)


def test_runtime_import_of_os_through_an_allowed_module_is_refused() -> None:
    with pytest.raises(SandboxError):
        load("from typing import sys\n", "<t>")  # passes the AST check, fails at exec


def test_no_policy_class() -> None:
    report = check("import math\nX = 1\n")
    assert not report.ok and "exactly one subclass of KvPolicy; found 0" in report.errors[0].message


def test_two_policy_classes() -> None:
    second = GOOD.replace("class Canary", "class Other").replace('"canary"', '"other"')
    report = check(GOOD + second.split("\n\n\n", 1)[1])
    assert not report.ok and "found 2" in report.errors[0].message


def test_missing_method_and_wrong_name() -> None:
    no_route = GOOD.split("    def route")[0]
    report = check(no_route)
    assert not report.ok and "abstract: route" in " ".join(m for _, m in messages(report))
    report = check(GOOD, name="other")
    assert not report.ok and "name must be 'other'" in report.errors[0].message


def test_wrong_return_type_is_caught_by_the_dry_run() -> None:
    report = check(GOOD.replace("return []", "return None"))
    assert not report.ok and "must return a list of Decision" in report.errors[0].message


def test_exception_in_dry_run_reports_its_line() -> None:
    report = check(GOOD.replace("return least_loaded(view)", "return 1 / 0"))
    assert not report.ok
    [(line, message)] = messages(report)[:1]
    assert line == 12 and "ZeroDivisionError" in message


def test_slow_decide_fails_the_budget() -> None:
    # a decide that busy-loops for roughly 50 ms or more (about 20 ns per iteration)
    busy = GOOD.replace("        return []", "        n = 0\n        for i in range(2_500_000):\n"
                        "            n += i\n        return []")
    report = check(busy)
    assert not report.ok
    [message] = [m for _, m in messages(report)]
    assert "sample:decide took" in message and "budget is 5.0 ms" in message
    assert report.timings_ms["sample:decide"] > 5.0
