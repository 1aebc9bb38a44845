"""agentd SDK semantics in local mode: lazy values, dependencies, timeouts, wait, state."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

import agentd
from agentd.runtime import LocalRuntime


@pytest.fixture
def rt() -> Iterator[LocalRuntime]:
    with agentd.local_runtime() as runtime:
        yield runtime


gate = threading.Event()


@agentd.tool
def slow(value: Any, delay: float = 0.2) -> Any:
    time.sleep(delay)  # a tool that takes its time: futures are tested against it
    return value


@agentd.tool
def gated(value: Any) -> Any:
    assert gate.wait(5)
    return value


@agentd.tool
def add(a: Any, b: Any) -> Any:
    return a + b


@agentd.tool
def boom(msg: str) -> Any:
    raise ValueError(msg)


@agentd.agent(stateful=True)
class Counter:
    def __init__(self) -> None:
        self.calls: list[int] = []

    def push(self, n: int) -> list[int]:
        self.calls.append(n)
        return list(self.calls)


@agentd.agent(max_instances=3)
class Sleeper:
    def nap(self, s: float) -> str:
        time.sleep(s)  # a call that takes its time, so that calls overlap
        return threading.current_thread().name


def test_call_returns_future_at_once_and_materialises_on_use(rt: LocalRuntime) -> None:
    t0 = time.monotonic()
    f = slow("hello", 0.3)
    assert isinstance(f, agentd.Future) and time.monotonic() - t0 < 0.1
    assert not f.available()
    assert str(f) == "hello" and f.available()
    assert len(f) == 5 and f[1] == "e" and list(f) == list("hello") and "ell" in f
    assert f"{f:>6}" == " hello" and f.upper() == "HELLO"
    n = slow(20, 0.0)
    assert n + 1 == 21 and 1 + n == 21 and n * 2 == 40 and n / 4 == 5 and -n == -20
    assert n > 3 and bool(n) and not bool(slow(0, 0.0)) and int(n) == 20
    assert f.status == "done" and f.started_at is not None and f.finished_at is not None


def test_dependencies_are_recorded_and_callee_gets_values(rt: LocalRuntime) -> None:
    gate.clear()
    a = gated(2)
    b = add(a, 3)  # depends on an unresolved future
    c = add(b, slow(10, 0.0))
    assert b.dependencies == [a.id] and a.consumers == [b.id]
    assert len(c.dependencies) == 2 and c.dependencies[0] == b.id
    assert not b.available()  # cannot run before a
    gate.set()
    assert c.value(timeout=5) == 15
    created = [e for e in rt.events if e["event"] == "future.created" and e["id"] == b.id]
    assert created and created[0]["dependencies"] == [a.id]
    assert created[0]["creator"] == "driver"
    resolved = {e["id"] for e in rt.events if e["event"] == "future.resolved"}
    assert {a.id, b.id, c.id} <= resolved


def test_timeout_and_failure(rt: LocalRuntime) -> None:
    f = slow("late", 1.0)
    with pytest.raises(TimeoutError):
        f.value(timeout=0.05)
    assert f.value(timeout=5) == "late"
    e = boom("bad input")
    with pytest.raises(ValueError, match="bad input") as info:
        e.value(timeout=5)
    assert any("tool boom" in n for n in info.value.__notes__)
    dep = add(e, 1)  # a failed dependency fails the consumer
    with pytest.raises(agentd.DependencyError, match="boom"):
        dep.value(timeout=5)
    assert dep.status == "failed" and dep.metadata()["error"].startswith("DependencyError")


def test_wait_all_and_first(rt: LocalRuntime) -> None:
    fast, late = slow(1, 0.0), slow(2, 1.0)
    done, pending = agentd.wait([fast, late], timeout=5, return_when=agentd.FIRST)
    assert fast in done and late in pending
    done, pending = agentd.wait([fast, late], timeout=0.01)
    assert late in pending
    done, pending = agentd.wait([fast, late], timeout=5)
    assert done == {fast, late} and not pending
    with pytest.raises(ValueError):
        agentd.wait([fast], return_when="SOMETIMES")


def test_stateful_agent_keeps_one_instance_in_order(rt: LocalRuntime) -> None:
    c = Counter()
    futures = [agentd.as_future(c.push(i)) for i in range(6)]
    assert futures[-1].value(timeout=5) == list(range(6))
    assert agentd.as_stub(c).instances == 1 and {f.executor for f in futures} == {"Counter#0"}


def test_as_stub_gives_a_decorated_class_stub_and_refuses_anything_else(
        rt: LocalRuntime) -> None:
    assert agentd.as_stub(Sleeper()).instances == 1  # registers the agent: min_instances
    with pytest.raises(TypeError, match="expected an agentd agent stub, got str"):
        agentd.as_stub("Sleeper")


def test_max_instances_runs_in_parallel_up_to_the_limit(rt: LocalRuntime) -> None:
    s = agentd.as_stub(Sleeper())
    t0 = time.monotonic()
    futures = [s.nap(0.3) for _ in range(3)]
    agentd.wait(futures, timeout=5)
    assert time.monotonic() - t0 < 0.8  # three instances, not one after another
    assert s.instances == 3
    more = [s.nap(0.0) for _ in range(5)]
    agentd.wait(more, timeout=5)
    assert s.instances == 3


def test_managed_state_local(rt: LocalRuntime) -> None:
    d = agentd.ManagedDict("prefs", {"lang": "en"})
    d["tz"] = "UTC"
    lst = agentd.ManagedList("history")
    lst.append(1)
    lst += [2, 3]
    assert isinstance(d, dict) and isinstance(lst, list)
    assert rt.state == {"prefs": {"lang": "en", "tz": "UTC"}, "history": [1, 2, 3]}
    assert agentd.ManagedList("history") == [1, 2, 3]  # a new object sees the stored value
    with pytest.raises(TypeError, match="JSON"):
        d["bad"] = object()
    with pytest.raises(ValueError):
        agentd.ManagedDict("no spaces")


def test_llm_without_endpoint_is_a_clear_error(rt: LocalRuntime,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AGENTD_URL", raising=False)
    with pytest.raises(agentd.LLMUnavailable, match="AGENTD_URL"):
        agentd.llm("hi")
