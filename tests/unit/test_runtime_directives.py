"""What the daemon reports and pins for an agent's `resources` and `batchable`."""

from __future__ import annotations

import threading

import agentd
from agentd import runtime as rt_mod
from daemon.runtime.directives import acted_on, instance_programs
from scheduling.agents.policy import Directives, InstanceView

# Each call holds its slot until all three hold one: three slots in use at once.
ALL_IN_SLOTS = threading.Barrier(3, timeout=10)


@agentd.agent(batchable=True, max_batch=3)
class Wide:
    def key(self) -> str | None:
        ALL_IN_SLOTS.wait()
        return rt_mod._current_llm_key()


def test_every_batch_slot_program_is_one_the_daemon_pins() -> None:
    with agentd.local_runtime():
        w = Wide()
        keys = {str(f) for f in [w.key() for _ in range(3)]}
    programs = instance_programs("prog-1", InstanceView("Wide#0", "Wide", slots=3))
    assert programs == ["prog-1.Wide.0", "prog-1.Wide.0.1", "prog-1.Wide.0.2"]
    assert {f"prog-1.{k}" for k in keys} == set(programs)
    assert instance_programs("p", InstanceView("Solo#2", "Solo")) == ["p.Solo.2"]


def test_acted_on_names_what_the_directives_change() -> None:
    res = Directives(resources={"memory_mb": 100}, batchable=True, preemptable=False)
    assert acted_on(res, reserving=True) == ["kv-pin", "reservation", "batch"]
    assert acted_on(res, reserving=False) == ["kv-pin", "batch"]  # no capacity reported
    assert acted_on(Directives(), reserving=True) == []
