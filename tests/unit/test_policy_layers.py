"""The ordering, meta and admission layers: operator sources validated against their
interfaces and dry runs, and every built-in passing its own layer's checks."""

from __future__ import annotations

import ast
import time
from pathlib import Path
from typing import Any

import pytest

from daemon.policies.layers import LAYERS
from daemon.policies.validate import Report, validate
from scheduling.layers import KeepMeta, RulesMeta

LONGEST_FIRST = """\
from scheduling.slo.ordering import KeyedPolicy


class LongestFirst(KeyedPolicy):
    name = "longest-first"

    def key(self, request):
        return (-request.t_tot,)
"""
FORGETFUL = """\
from scheduling.slo.ordering import Fcfs


class Forgetful(Fcfs):
    name = "forgetful"

    def push(self, request, now):
        if request.tenant != "b":
            super().push(request, now)
"""
SLOW = """\
from scheduling.slo.ordering import Fcfs


class Slow(Fcfs):
    name = "slow"

    def pop(self, now):
        total = 0
        for i in range(300000):
            total += i
        return super().pop(now)
"""
KV_SHAPED = """\
from scheduling.kv.baselines import StickyPolicy


class NotOrdering(StickyPolicy):
    name = "not-ordering"
"""
STRICT_RULES = """\
from scheduling.layers import RulesMeta
from scheduling.slo.meta import RuleThresholds


class StrictRules(RulesMeta):
    name = "strict-rules"

    def __init__(self):
        super().__init__(RuleThresholds(min_completions=5, deadline_violation=0.05))
"""
CHATTY_META = """\
from scheduling.layers import MetaPolicy


class Chatty(MetaPolicy):
    name = "chatty"

    def choose(self, view, now):
        return "edf, because I said so"
"""
SMALL_BATCHES = """\
from scheduling.layers import StateraAdmission


class SmallBatches(StateraAdmission):
    name = "small-batches"

    def __init__(self):
        super().__init__(n_min=1)

    def controls(self, worker, utilisation, n_max, bypass):
        return super().controls(worker, utilisation, min(n_max, 8), bypass)
"""
YES_MAN = """\
from scheduling.layers import UnboundedAdmission


class YesMan(UnboundedAdmission):
    name = "yes-man"

    def admit(self, request, worker, fence, controls):
        return True
"""


def check(layer: str, name: str, source: str) -> Report:
    now = time.time()
    spec = LAYERS[layer]
    return validate(spec, name, source, [("sample", spec.sample(now))], now, 2)


def problems(report: Report) -> str:
    return "; ".join(e.message for e in report.errors)


@pytest.mark.parametrize(("layer", "name", "source"), [
    ("ordering", "longest-first", LONGEST_FIRST),
    ("meta", "strict-rules", STRICT_RULES),
    ("admission", "small-batches", SMALL_BATCHES),
])
def test_sound_operator_policies_pass(layer: str, name: str, source: str) -> None:
    report = check(layer, name, source)
    assert report.ok, problems(report)
    assert report.timings_ms and max(report.timings_ms.values()) < report.budget_ms


@pytest.mark.parametrize(("layer", "name", "source", "expected"), [
    ("ordering", "forgetful", FORGETFUL, "len() is"),
    ("ordering", "slow", SLOW, "the budget is"),
    ("ordering", "not-ordering", KV_SHAPED, "exactly one subclass of OrderingPolicy"),
    ("meta", "chatty", CHATTY_META, "choose must return a scheduling.slo.meta.Decision"),
    ("admission", "yes-man", YES_MAN, "admit must return an AdmissionDecision"),
])
def test_broken_operator_policies_are_refused(layer: str, name: str, source: str,
                                              expected: str) -> None:
    report = check(layer, name, source)
    assert not report.ok and expected in problems(report), problems(report)


@pytest.mark.parametrize("layer", ["ordering", "meta", "admission"])
def test_every_builtin_passes_its_layers_dry_run(layer: str) -> None:
    spec, now = LAYERS[layer], time.time()
    for name, factory in spec.builtins.items():
        policy: Any = factory()
        for label, thunk in spec.dry_calls(spec.sample(now), now):
            assert thunk(policy) is None, f"{name} {label}"


def test_builtin_meta_policies_keep_or_react() -> None:
    hol = LAYERS["meta"].sample(time.time())[1]
    assert RulesMeta().choose(hol, 0.0).policy_name == "two_lane"
    off = KeepMeta()
    off.on_applied("sjf")
    assert off.choose(hol, 0.0).policy_name == "sjf" and not off.guards


def test_layer_interfaces_module_is_pure() -> None:
    path = Path(__file__).resolve().parents[2] / "scheduling" / "layers.py"
    roots = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            roots |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            roots.add(node.module.split(".")[0])
    assert roots <= {"__future__", "abc", "collections", "typing", "scheduling"}
