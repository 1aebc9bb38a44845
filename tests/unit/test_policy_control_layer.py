"""The `control` layer: validation of operator control policies (compile, restricted
imports, interface, dry run on the sample view with its time budget) and the guard that
runs the active version off the event loop and rolls a failing one back."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from daemon.policies.agents_guard import ControlGuard
from daemon.policies.layers import LAYERS
from daemon.policies.swap import Active, Failure
from daemon.policies.validate import Report, validate
from scheduling.agents.policies import CONTROL_POLICIES, sample_view
from scheduling.agents.policy import ControlDecision, ControlPolicy, ControlView, Kill, SetPriority
from tests.waiting import wait_for_async

SPEC = LAYERS["control"]

SOUND = '''\
from scheduling.agents.policy import ControlPolicy, set_priority


class DeepFirst(ControlPolicy):
    name = "deep-first"
    period_s = 0.25

    def decide(self, view, now):
        installed = view.rules.priorities
        return [set_priority(s.session_id, float(s.deepest_stage), reason="deepest first")
                for s in view.sessions.values()
                if installed.get(s.session_id, 0.0) != s.deepest_stage]
'''
SLOW = '''\
from scheduling.agents.policy import ControlPolicy


class Ponder(ControlPolicy):
    name = "ponder"

    def decide(self, view, now):
        total = 0
        for i in range(3_000_000):
            total += i
        return []
'''
KV_SHAPED = '''\
from scheduling.kv.baselines import StickyPolicy


class NotControl(StickyPolicy):
    name = "not-control"
'''
NO_DECIDE = '''\
from scheduling.agents.policy import ControlPolicy


class Hooks(ControlPolicy):
    name = "hooks"

    def on_session_end(self, view, session_id, now):
        return []
'''
KILLS_A_STRANGER = '''\
from scheduling.agents.policy import ControlPolicy, kill


class Reaper(ControlPolicy):
    name = "reaper"

    def decide(self, view, now):
        return [kill("Ghost#9", reason="no such instance")]
'''
RETURNS_NONE_ON_END = '''\
from scheduling.agents.policy import ControlPolicy


class Forgetful(ControlPolicy):
    name = "forgetful"

    def decide(self, view, now):
        return []

    def on_session_end(self, view, session_id, now):
        return None
'''
FROZEN_PERIOD = '''\
from scheduling.agents.policy import ControlPolicy


class Never(ControlPolicy):
    name = "never"
    period_s = 0

    def decide(self, view, now):
        return []
'''


def check(name: str, source: str) -> Report:
    now = time.time()
    return validate(SPEC, name, source, [("sample", SPEC.sample(now))], now, 2)


def found(report: Report) -> list[tuple[int | None, str]]:
    return [(e.line, e.message) for e in report.errors]


def test_a_sound_operator_policy_passes_with_every_call_timed() -> None:
    report = check("deep-first", SOUND)
    assert report.ok, found(report)
    assert report.class_name == "DeepFirst" and report.snapshots == ["sample"]
    labels = set(report.timings_ms)
    assert {"sample:decide", "sample:period_s"} <= labels
    assert any(label.startswith("sample:on_instance_change(") for label in labels)
    assert any(label.startswith("sample:on_session_end(") for label in labels)
    assert max(report.timings_ms.values()) < report.budget_ms


def test_a_syntax_error_names_its_line() -> None:
    source = SOUND + "\n    def broken(self):\n        return [\n"
    [(line, message)] = found(check("deep-first", source))
    assert "syntax error" in message and line == len(source.splitlines())


@pytest.mark.parametrize(("snippet", "word"), [
    ("import os", "os"), ("from subprocess import run", "subprocess"),
    ("import socket", "socket"), ("from urllib.request import urlopen", "urllib"),
])
def test_a_forbidden_import_names_its_line(snippet: str, word: str) -> None:
    source = SOUND + f"\n    def helper(self):\n        {snippet}\n"
    [(line, message)] = found(check("deep-first", source))
    assert word in message and "not allowed" in message
    assert line == len(source.splitlines())


def test_file_access_names_its_line() -> None:
    source = SOUND + "\n    def helper(self):\n        return open('/etc/passwd')\n"
    [(line, message)] = found(check("deep-first", source))
    assert "'open' is not allowed" in message and line == len(source.splitlines())


def test_another_layers_policy_is_the_wrong_interface() -> None:
    [(_, message)] = found(check("not-control", KV_SHAPED))
    assert "exactly one subclass of ControlPolicy; found 0" in message


def test_a_policy_without_decide_is_refused_at_its_class_line() -> None:
    [(line, message)] = found(check("hooks", NO_DECIDE))
    assert "Hooks leaves abstract: decide" in message and line == 4


def test_the_name_must_be_the_policys_name() -> None:
    [(line, message)] = found(check("other-name", SOUND))
    assert "DeepFirst.name must be 'other-name'" in message and line == 5


def test_a_slow_policy_is_refused_with_its_hot_line() -> None:
    report = check("ponder", SLOW)
    assert not report.ok
    [(line, message)] = found(report)
    assert "sample:decide took" in message and "the budget is 5.0 ms" in message
    assert line in (9, 10)  # the loop's header or its body


def test_decisions_the_view_refuses_fail_the_dry_run() -> None:
    [(_, message)] = found(check("reaper", KILLS_A_STRANGER))
    assert "decide returned a decision its view refuses" in message
    assert "instance 'Ghost#9' is not alive" in message


def test_a_hook_must_return_a_list() -> None:
    messages = [m for _, m in found(check("forgetful", RETURNS_NONE_ON_END))]
    assert messages and all("on_session_end must return a list of decisions, got NoneType"
                            in m for m in messages)  # one per session of the view


def test_a_period_the_loop_cannot_keep_is_refused() -> None:
    [(_, message)] = found(check("never", FROZEN_PERIOD))
    assert "period_s must be within 0.05..60.0 s, got 0" in message


@pytest.mark.parametrize("name", sorted(CONTROL_POLICIES))
def test_every_builtin_passes_the_dry_run(name: str) -> None:
    now = time.time()
    policy = CONTROL_POLICIES[name]()
    for label, thunk in SPEC.dry_calls(SPEC.sample(now), now):
        assert thunk(policy) is None, f"{name} {label}"


def test_the_live_snapshot_is_empty_without_a_control_loop() -> None:
    view = SPEC.live(object())
    assert isinstance(view, ControlView) and not view.futures and not view.instances


# --- the guard ------------------------------------------------------------------------


class Quiet(ControlPolicy):
    name = "quiet"
    period_s = 0.1

    def decide(self, view: ControlView, now: float) -> list[ControlDecision]:
        return [SetPriority("s1", 2.0, reason="quiet")]


class Raising(ControlPolicy):
    name = "raising"

    def decide(self, view: ControlView, now: float) -> list[ControlDecision]:
        raise RuntimeError("boom")


class Refused(ControlPolicy):
    name = "refused"

    def decide(self, view: ControlView, now: float) -> list[ControlDecision]:
        return [Kill("Ghost#9")]


class Spinning(ControlPolicy):
    name = "spinning"
    period_s = 0.05  # budget: 25 ms of CPU

    def decide(self, view: ControlView, now: float) -> list[ControlDecision]:
        until = time.thread_time() + 0.08
        while time.thread_time() < until:
            pass
        return []


class Stuck(ControlPolicy):
    name = "stuck"
    period_s = 0.05

    def decide(self, view: ControlView, now: float) -> list[ControlDecision]:
        while True:
            pass


def guarded(new: ControlPolicy, probation_s: float = 30.0) -> tuple[ControlGuard,
                                                                    list[Failure]]:
    failures: list[Failure] = []
    guard = ControlGuard(Active("quiet", 1, Quiet()), failures.append, probation_s)
    guard.swap(Active(new.name, 2, new))
    return guard, failures


async def test_a_raising_version_is_rolled_back_and_the_previous_answers_the_step() -> None:
    guard, failures = guarded(Raising())
    now = time.time()
    active, step = await guard.step(sample_view(now), now)
    assert (active.name, active.version) == ("quiet", 1) and step.policy == "quiet"
    assert step.accepted == (SetPriority("s1", 2.0, reason="quiet"),)
    [failure] = failures
    assert failure.layer == "control" and failure.failed.name == "raising"
    assert failure.reason == "raised RuntimeError: boom"
    assert guard.current.name == "quiet" and guard.period_s == 0.1


async def test_refused_decisions_roll_back_only_during_probation() -> None:
    now = time.time()
    guard, failures = guarded(Refused())
    active, _ = await guard.step(sample_view(now), now)
    assert active.name == "quiet"
    assert "decision(s) refused during probation" in failures[0].reason
    assert "instance 'Ghost#9' is not alive" in failures[0].reason
    settled, failures = guarded(Refused(), probation_s=0.0)
    active, step = await settled.step(sample_view(now), now)
    assert active.name == "refused" and len(step.rejected) == 1 and not failures


async def test_a_step_over_its_budget_rolls_back_during_probation() -> None:
    now = time.time()
    guard, failures = guarded(Spinning())
    active, _ = await guard.step(sample_view(now), now)
    assert active.name == "quiet"
    assert "of CPU during probation; the budget is 25.0 ms" in failures[0].reason


async def test_a_stuck_step_is_interrupted_and_rolled_back() -> None:
    now = time.time()
    guard, failures = guarded(Stuck())
    started = time.monotonic()
    active, _ = await guard.step(sample_view(now), now)
    assert active.name == "quiet" and time.monotonic() - started < 3.0
    assert "PolicyTimeout: still running after 1.0 s" in failures[0].reason
    await wait_for_async(lambda: not any(t.name == "control-step" for t in threading.enumerate()),
                         2.0, "the stuck step's thread to be interrupted", interval=0.05)


async def test_with_nothing_to_fall_back_to_an_exception_reaches_the_loop() -> None:
    guard = ControlGuard(Active("raising", 1, Raising()))
    with pytest.raises(RuntimeError, match="boom"):
        await guard.step(sample_view(time.time()), time.time())


async def test_a_version_replaced_mid_step_is_not_held_against_the_new_one() -> None:
    guard, failures = guarded(Raising())
    now = time.time()
    pending = asyncio.ensure_future(guard.step(sample_view(now), now))
    await asyncio.sleep(0)  # the step starts its thread under "raising"
    guard.swap(Active("refused", 3, Refused()))  # lands while the step runs
    active, step = await pending
    assert active.name == "raising" and step.accepted == () and step.rejected == ()
    assert guard.current.name == "refused" and not failures
