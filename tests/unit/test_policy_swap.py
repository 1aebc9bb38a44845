"""The guarded kv policy: swaps, rollback on exceptions and on slow calls in probation."""

from __future__ import annotations

import time

from daemon.policies.layers import sample_kv_view
from daemon.policies.swap import HISTORY, Active, Failure, Guard, GuardedKvPolicy
from scheduling.kv import Decision, KvPolicy, KvView, StickyPolicy, VllmDefaultPolicy


class Raising(StickyPolicy):
    name = "raising"

    def decide(self, view: KvView, now: float) -> list[Decision]:
        raise RuntimeError("boom")


class Slow(StickyPolicy):
    name = "slow"

    def route(self, view: KvView, program_id: str, now: float) -> str | None:
        spin_until = time.thread_time() + 0.06  # CPU time: what the guard's budget counts
        while time.thread_time() < spin_until:
            pass
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


def test_on_change_runs_for_swaps_rollbacks_and_failures() -> None:
    changes: list[str] = []
    failures: list[Failure] = []
    guard = Guard(Active("a", 1, VllmDefaultPolicy()), failures.append, layer="ordering",
                  on_change=lambda active: changes.append(active.name))
    guard.swap(Active("b", 2, Raising()))
    view = sample_kv_view(0.0)
    assert guard.call(lambda p: p.decide(view, 0.0)) == VllmDefaultPolicy().decide(view, 0.0)
    assert changes == ["b", "a"] and guard.name == "a"
    assert failures[0].layer == "ordering" and failures[0].failed.name == "b"
    guard.swap(Active("c", 3, StickyPolicy()))
    assert guard.restore_previous() is not None and changes == ["b", "a", "c", "a"]


def test_reject_rolls_back_or_rebuilds_in_place() -> None:
    changes: list[str] = []
    guard = Guard(Active("a", 1, StickyPolicy()), on_change=lambda a: changes.append(a.name))
    guard.reject("lost work")  # nothing to fall back to: the same version, rebuilt
    assert guard.name == "a" and changes == ["a"]
    guard.swap(Active("b", 2, StickyPolicy()))
    guard.reject("invented work")
    assert guard.name == "a" and changes == ["a", "b", "a"]


def test_history_is_bounded() -> None:
    guard = Guard(Active("p0", 1, StickyPolicy()))
    for n in range(1, 40):
        guard.swap(Active(f"p{n}", 1, StickyPolicy()))
    assert len(guard.previous) == HISTORY and guard.previous[-1].name == "p38"
