"""The daemon's ordered queue: rebuild in place on a switch, and a misbehaving policy rolled
back without dropping or duplicating a queued request."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from daemon.policies.slo_layers import ORDERING_BUILTINS
from daemon.policies.swap import Active, Failure
from daemon.slo.queue import OrderedQueue
from scheduling.slo.ordering import Fcfs, OrderingPolicy
from scheduling.slo.prediction import QueuedRequest
from scheduling.slo.templates import TABLE_6, TaskType

NOW = 1000.0
POLICIES = sorted(ORDERING_BUILTINS)


def request(n: int, tenant: str, l_pred: int, arrival: float) -> QueuedRequest:
    task = TaskType.QA
    return QueuedRequest(f"r{n:04d}", tenant, arrival, 100, task, 0.75, TABLE_6[task], l_pred,
                         2 * l_pred, 0.05, 0.03, priority=n % 3, generated_tokens=n % 5 * 40)


def queue(name: str = "fcfs") -> tuple[OrderedQueue, list[Failure]]:
    failures: list[Failure] = []
    return OrderedQueue(Active(name, 1, ORDERING_BUILTINS[name]()), failures.append,
                        clock=lambda: NOW), failures


def drain(q: OrderedQueue) -> list[str]:
    out = []
    while (head := q.peek(NOW)) is not None:
        assert q.take(head, NOW)
        out.append(head.request_id)
    return out


def fresh_order(name: str, requests: list[QueuedRequest]) -> list[str]:
    policy = ORDERING_BUILTINS[name]()
    policy.rebuild(requests, NOW)
    return [policy.pop(NOW).request_id for _ in requests]


ops = st.lists(st.one_of(
    st.tuples(st.just("push"), st.sampled_from("abc"), st.integers(1, 2000)),
    st.tuples(st.just("take")),
    st.tuples(st.just("discard"), st.integers(0, 50)),
    st.tuples(st.just("switch"), st.sampled_from(POLICIES)),
), max_size=60)


@settings(max_examples=150, deadline=None)
@given(ops, st.sampled_from(POLICIES))
def test_switches_keep_every_queued_request_once(script: list[tuple], final: str) -> None:  # type: ignore[type-arg]
    q, failures = queue()
    expected: dict[str, QueuedRequest] = {}
    taken: list[str] = []
    counter = itertools.count()
    for op in script:
        if op[0] == "push":
            n = next(counter)
            r = request(n, op[1], op[2], NOW - 100 + n)
            q.push(r, NOW)
            expected[r.request_id] = r
        elif op[0] == "take" and (head := q.peek(NOW)) is not None:
            assert head.request_id in expected and q.take(head, NOW)
            taken.append(expected.pop(head.request_id).request_id)
        elif op[0] == "discard" and expected:
            rid = sorted(expected)[op[1] % len(expected)]
            assert q.discard(rid) is expected.pop(rid)
        elif op[0] == "switch":
            q.switch(Active(op[1], 1, ORDERING_BUILTINS[op[1]]()))
        assert sorted(q.live) == sorted(expected) and len(q) == len(expected)
    assert len(taken) == len(set(taken))
    # After a last switch the queue pops exactly what a fresh policy rebuilt from the
    # same requests pops, in the same order: nothing dropped, duplicated or misordered.
    q.switch(Active(final, 1, ORDERING_BUILTINS[final]()))
    assert drain(q) == fresh_order(final, list(expected.values()))
    assert not failures


class Raising(Fcfs):
    name = "raising"

    def __init__(self, every: int) -> None:
        super().__init__()
        self.calls, self.every = 0, every

    def push(self, request: QueuedRequest, now: float) -> None:
        self.calls += 1
        if self.calls % self.every == 0:
            raise RuntimeError("boom")
        super().push(request, now)


class Losing(Fcfs):
    """Forgets every second request it is given."""

    name = "losing"

    def __init__(self) -> None:
        super().__init__()
        self.n = 0

    def push(self, request: QueuedRequest, now: float) -> None:
        self.n += 1
        if self.n % 2:
            super().push(request, now)


class Repeating(Fcfs):
    """Pops without removing: hands out the same request again and again."""

    name = "repeating"

    def pop(self, now: float) -> QueuedRequest:
        head = self.peek(now)
        if head is None:
            raise IndexError("empty")
        return head


class Inventing(Fcfs):
    """Claims a request nobody queued."""

    name = "inventing"

    def peek(self, now: float) -> QueuedRequest | None:
        return request(9999, "x", 1, 0.0)


def run_broken(bad: OrderingPolicy, pushes: int = 12) -> tuple[list[str], list[Failure]]:
    q, failures = queue("sjf")
    for n in range(pushes // 2):
        q.push(request(n, "a", 100 * (n + 1), NOW - 50 + n), NOW)
    q.switch(Active(bad.name, 2, bad))
    for n in range(pushes // 2, pushes):
        q.push(request(n, "a", 100 * (n + 1), NOW - 50 + n), NOW)
    popped = drain(q)
    assert q.guard.name == "sjf" and len(q) == 0
    return popped, failures


def test_a_policy_that_raises_is_rolled_back_and_nothing_is_lost() -> None:
    popped, failures = run_broken(Raising(every=3))
    assert sorted(popped) == [f"r{n:04d}" for n in range(12)]
    assert popped == fresh_order("sjf", [request(n, "a", 100 * (n + 1), 0) for n in range(12)])
    [failure] = failures
    assert failure.layer == "ordering" and "RuntimeError: boom" in failure.reason


def test_a_policy_that_loses_requests_is_rolled_back() -> None:
    popped, failures = run_broken(Losing())
    assert sorted(popped) == [f"r{n:04d}" for n in range(12)]
    assert "while" in failures[0].reason and "queued" in failures[0].reason


def test_a_policy_that_repeats_a_request_never_gets_it_dispatched_twice() -> None:
    popped, failures = run_broken(Repeating())
    assert sorted(popped) == [f"r{n:04d}" for n in range(12)] and len(set(popped)) == 12
    assert failures and failures[0].failed.name == "repeating"


def test_a_policy_that_invents_a_request_is_rolled_back() -> None:
    popped, failures = run_broken(Inventing())
    assert sorted(popped) == [f"r{n:04d}" for n in range(12)]
    assert "r9999" in failures[0].reason and "not queued" in failures[0].reason


def test_aborted_requests_are_skipped_lazily_and_then_rebuilt_away() -> None:
    q, _ = queue("sjf")
    for n in range(6):
        q.push(request(n, "a", 10 * (6 - n), NOW + n), NOW)
    q.discard("r0005")  # the shortest: at the head
    q.discard("r0002")
    assert len(q) == 4
    assert drain(q) == ["r0004", "r0003", "r0001", "r0000"]
    assert not q.guard.previous  # skipping aborted entries is no failure


def test_with_nothing_to_fall_back_to_a_broken_policy_is_rebuilt_in_place() -> None:
    failures: list[Failure] = []
    q = OrderedQueue(Active("losing", 1, Losing()), failures.append, clock=lambda: NOW)
    for n in range(4):
        q.push(request(n, "a", 10, NOW + n), NOW)
    # The rebuild pushes all four again and Losing keeps two: each peek finds some.
    seen = drain(q)
    assert sorted(seen) == ["r0000", "r0001", "r0002", "r0003"] and not failures
