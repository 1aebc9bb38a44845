"""The `resources` and `batchable` directives through the SDK, in local mode with a
run-like capacity: reservations refuse what does not fit, and a batchable instance
runs its queued calls at once, each with an LLM program of its own."""

from __future__ import annotations

import threading
import time

import pytest

import agentd
from agentd import runtime as rt_mod
from agentd.instances import ResourceError
from agentd.runtime import process_capacity
from scheduling.agents.resources import NoCapacity
from tests.waiting import wait_for

CAP = {"memory_mb": 1024.0, "CPU": 2.0, "GPU": 0.0}
DELAY = 0.3
N = 6


@agentd.agent(resources={"memory_mb": 4096})
class Huge:
    def ping(self) -> str:
        return "pong"


@agentd.agent(min_instances=3, max_instances=3, resources={"memory_mb": 400})
class Twin:
    def ping(self) -> str:
        return "pong"


@agentd.agent(min_instances=0, resources={"memory_mb": 300})
class Late:
    def ping(self) -> str:
        return "pong"


@agentd.agent(resources={"GPU": 1})
class Gpu:
    def ping(self) -> str:
        return "pong"


def test_an_agent_that_cannot_fit_at_all_fails_its_first_call() -> None:
    with agentd.local_runtime(capacity=CAP):
        with pytest.raises(ResourceError, match=r"Huge reserves memory_mb=4096.*1024"):
            Huge().ping()
        with pytest.raises(ResourceError, match="GPU"):  # no GPU unless configured
            Gpu().ping()
    with agentd.local_runtime():  # local mode without a capacity: nothing is reserved
        assert str(Huge().ping()) == "pong"


def test_start_up_and_calls_are_held_to_the_capacity() -> None:
    with agentd.local_runtime(capacity=CAP, resource_wait_s=0.5) as rt:
        twin = Twin()
        # the third of min_instances does not fit: 1200 > 1024
        assert agentd.as_stub(twin).instances == 2
        assert str(twin.ping()) == "pong"
        t0 = time.perf_counter()
        # fits the run, not beside the twins: waits, then fails
        late = agentd.as_future(Late().ping())
        with pytest.raises(ResourceError) as caught:
            late.value(timeout=10)
        waited = time.perf_counter() - t0
    assert 0.5 <= waited < 5, waited
    assert str(caught.value).startswith("agent Late waited 0.5 s for resources and none "
                                        "freed: Late reserves memory_mb=300 per instance; "
                                        "224 of the run's memory_mb=1024 is free")
    refused = [e for e in rt.events if e["event"] == "control.applied" and not e["ok"]]
    assert [(e["agent_type"], e["reason"]) for e in refused] == [("Twin", "min_instances")]
    assert "memory_mb" in refused[0]["detail"]
    waits = [e for e in rt.events if e["event"] in ("future.waiting", "future.wait_expired")]
    assert [(e["event"], e["agent_type"], e["resource"], e["need"], e["free"])
            for e in waits] == [("future.waiting", "Late", "memory_mb", 300, 224),
                                ("future.wait_expired", "Late", "memory_mb", 300, 224)]


@agentd.agent(min_instances=1, max_instances=2, resources={"memory_mb": 400})
class Holder:
    def ping(self) -> str:
        return "pong"


@agentd.agent(min_instances=0, resources={"memory_mb": 300})
class Waiter:
    def ping(self, x: int) -> int:
        return x + 1


def test_a_waiting_call_runs_when_a_kill_makes_room_and_its_consumer_follows() -> None:
    with agentd.local_runtime(capacity=CAP, resource_wait_s=30) as rt:
        holder = agentd.as_stub(Holder())
        assert holder.instances == 1  # registers the type
        assert rt.control.apply([{"kind": "Provision", "agent_type": "Holder"}])[0].ok
        assert holder.instances == 2  # 800 of 1024 MiB reserved
        first = Waiter().ping(1)  # waits: 224 MiB free
        second = Waiter().ping(first)  # depends on the waiting call: waits behind it
        wait_for(lambda: rt.control.cluster.waiting() == 2, 5, "both calls to wait for room")
        assert not agentd.as_future(first).available()
        assert not agentd.as_future(second).available()
        t0 = time.perf_counter()
        applied = rt.control.apply([{"kind": "Kill", "instance_id": "Holder#1"}])
        assert applied[0].ok, applied
        assert int(agentd.as_future(second).value(timeout=10)) == 3
        assert time.perf_counter() - t0 < 2
        assert agentd.as_stub(Waiter()).instances == 1
    placed = [e for e in rt.events if e["event"] == "future.placed"
              and e["agent_type"] == "Waiter"]
    assert [e["instance"] for e in placed] == ["Waiter#0", "Waiter#0"]
    assert all("waiting for resources" in e["reason"] for e in placed)
    assert not [e for e in rt.events if e["event"] == "future.wait_expired"]


def test_the_wait_comes_from_the_environment() -> None:
    from agentd.runtime import DEFAULT_RESOURCE_WAIT_S, resource_wait

    assert resource_wait({}) == DEFAULT_RESOURCE_WAIT_S == 60.0
    assert resource_wait({"AGENTD_RESOURCE_WAIT_S": "2.5"}) == 2.5
    for bad in ("soon", "-1", "nan"):
        with pytest.raises(ValueError, match="AGENTD_RESOURCE_WAIT_S"):
            resource_wait({"AGENTD_RESOURCE_WAIT_S": bad})


def test_without_a_wait_a_call_without_room_fails_at_once() -> None:
    with agentd.local_runtime(capacity=CAP, resource_wait_s=0) as rt:
        assert agentd.as_stub(Twin()).instances == 2
        late = agentd.as_future(Late().ping())
        with pytest.raises(NoCapacity, match="no live instance of Late"):
            late.value(timeout=5)
    assert not [e for e in rt.events if e["event"] == "future.waiting"]


def test_process_capacity_reads_this_process_limits() -> None:
    cap = process_capacity({"AGENTD_GPUS": "2"})
    assert cap["GPU"] == 2.0 and cap["CPU"] >= 1 and cap["memory_mb"] > 0
    assert process_capacity({})["GPU"] == 0.0


def test_max_batch_is_checked() -> None:
    with pytest.raises(ValueError, match="max_batch"):
        agentd.agent(batchable=True, max_batch=0)(Twin)


@agentd.agent(batchable=True, max_batch=8)
class Batched:
    def work(self, i: int) -> tuple[int, str | None]:
        time.sleep(DELAY)  # each call's own time: batched calls overlap it, serial ones add up
        return i, rt_mod._current_llm_key()


@agentd.agent
class Serial:
    def work(self, i: int) -> tuple[int, str | None]:
        time.sleep(DELAY)  # each call's own time, as in Batched
        return i, rt_mod._current_llm_key()


def _timed(cls: type) -> tuple[float, list[tuple[int, str | None]]]:
    stub = cls()
    t0 = time.perf_counter()
    futures = [stub.work(i) for i in range(N)]
    out = [f.value(timeout=30) for f in futures]
    return time.perf_counter() - t0, out


def test_a_batchable_instance_runs_its_queued_calls_at_once() -> None:
    with agentd.local_runtime():
        batched_s, batched = _timed(Batched)
        serial_s, serial = _timed(Serial)
        assert agentd.as_stub(Batched()).instances == agentd.as_stub(Serial()).instances == 1
    assert [i for i, _ in batched] == [i for i, _ in serial] == list(range(N))
    assert serial_s >= N * DELAY
    assert batched_s < 3 * DELAY, (batched_s, serial_s)  # about one call's time
    # concurrent calls of one instance use distinct LLM programs (one request each)
    assert len({key for _, key in batched}) == N
    assert {key for _, key in serial} == {"Serial.0"}


def test_a_batch_builds_the_instance_object_once() -> None:
    built: list[int] = []
    lock = threading.Lock()

    @agentd.agent(batchable=True, max_batch=4)
    class Slow:
        def __init__(self) -> None:
            with lock:
                built.append(1)
            time.sleep(0.1)  # a slow constructor: the batch's calls arrive while it runs

        def f(self, i: int) -> int:
            return i

    with agentd.local_runtime():
        s = Slow()
        assert [int(x) for x in [s.f(i) for i in range(4)]] == [0, 1, 2, 3]
    assert built == [1]
