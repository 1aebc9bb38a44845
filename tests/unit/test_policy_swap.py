"""The guarded kv policy: swaps, rollback on exceptions and on slow calls in probation."""

from __future__ import annotations

import time

from daemon.policies.layers import sample_kv_view
from daemon.policies.swap import Active, Failure, GuardedKvPolicy
from scheduling.kv import Decision, KvPolicy, KvView, StickyPolicy, VllmDefaultPolicy


class Raising(StickyPolicy):
    name = "raising"

    def decide(self, view: KvView, now: float) -> list[Decision]:
        raise RuntimeError("boom")


class Slow(StickyPolicy):
    name = "slow"

    def route(self, view: KvView, program_id: str, now: float) -> str | None:
        time.sleep(0.06)
        return super().route(view, program_id, now)


def guarded(new: KvPolicy, probation_s: float = 30.0) -> tuple[GuardedKvPolicy, list[Failure]]:
    failures: list[Failure] = []
    guard = GuardedKvPolicy(Active("vllm-default", 1, VllmDefaultPolicy()), failures.append,
                            probation_s=probation_s)
    guard.swap(Active(new.name, 2, new))
    return guard, failures


def test_swap_changes_the_name_and_version_seen_by_traces() -> None:
    guard, failures = guarded(StickyPolicy())
    assert (guard.name, guard.version) == ("sticky", 2)
    view = sample_kv_view(time.time())
    assert guard.decide(view, time.time()) == StickyPolicy().decide(view, time.time())
    assert not failures


def test_an_exception_rolls_back_and_the_tick_gets_the_previous_answer() -> None:
    guard, failures = guarded(Raising())
    now = time.time()
    view = sample_kv_view(now)
    assert guard.decide(view, now) == VllmDefaultPolicy().decide(view, now)
    assert (guard.name, guard.version) == ("vllm-default", 1)
    [failure] = failures
    assert failure.failed.name == "raising" and "RuntimeError: boom" in failure.reason
    assert guard.decide(view, now) == VllmDefaultPolicy().decide(view, now)  # stays back
    assert len(failures) == 1


def test_a_slow_call_during_probation_rolls_back() -> None:
    guard, failures = guarded(Slow())
    now = time.time()
    assert guard.route(sample_kv_view(now), "p-new", now) is not None
    assert guard.name == "vllm-default"
    assert "during probation" in failures[0].reason


def test_a_slow_call_after_probation_is_kept() -> None:
    guard, failures = guarded(Slow(), probation_s=0.0)
    now = time.time()
    guard.route(sample_kv_view(now), "p-new", now)
    assert guard.name == "slow" and not failures


def test_with_nothing_to_fall_back_to_errors_propagate() -> None:
    guard = GuardedKvPolicy(Active("raising", 1, Raising()))
    try:
        guard.decide(sample_kv_view(time.time()), time.time())
    except RuntimeError:
        pass
    else:
        raise AssertionError("expected the error")


def test_operator_restore_previous() -> None:
    guard, _ = guarded(StickyPolicy())
    restored = guard.restore_previous()
    assert restored is not None and guard.name == "vllm-default"
    assert guard.restore_previous() is None
