"""What is done with an agent's directives (NALAR Table 1), learnt from the view its
run's sandbox reports (`agents`), once per agent type and run.

- `preemptable=False`: the agent's work must not be preempted, so each of its instances'
  programs (`<run program>.<Agent>.<i>`, the program an instance's LLM calls use, and
  `<...>.<i>.<slot>` for a batchable instance's other slots, see agentd/instances.py)
  gets the KV layer's pin hint: the KV policy never pauses a pinned program, so its KV
  cache stays on its worker between calls. Programs an instance creates later are
  pinned at the next report (every 0.25 s). Undeclared (None) or a preempt method's
  name: no hint.
- `resources` (`memory_mb`, `CPU`, `GPU`): enforced as logical reservations, the way Ray
  treats them, by the sandbox's local controllers and by the global controller's
  validation (scheduling/agents/resources.py). The run's capacity comes from its
  sandbox's limits: `memory_mb` its address-space limit, `CPU` the CPUs the sandbox may
  run on, `GPU` the daemon's `runtime_gpus` (default -1: the GPUs visible to the daemon,
  daemon/runtime/gpus.py), passed to the sandbox as `AGENTD_GPUS`.
  Each live instance reserves its agent's resources; a provision (a policy's or an
  operator's), a `min_instances` start-up or an on-demand growth that does not fit what
  the run's live instances already reserve is refused with the reason (a
  `control.decision` or `control.applied` event with `ok: false`); a kill frees the
  reservation at once (the instance drains under the run's limits). A call to an agent
  with no instance and no room for one waits (a `future.waiting` event naming the
  agent, the resource, what it needs and what is free) until a kill or a provision
  makes room (then a `future.placed` event), for at most the daemon's
  `runtime_resource_wait_s` (default 60 s) once ready; then it fails with a
  ResourceError naming the same (a `future.wait_expired` event). Room comes from the
  operator's or the active policy's kills: the default policy's resource reassignment
  kills idle instances of other agents for it, within their `min_instances`
  (scheduling/agents/policies/room.py). An agent whose one instance needs more than
  the run has in all fails the call that first uses it at once, and so the run, naming
  the agent, the resource and the capacity.
  Not enforced: isolation. An instance is a thread of its run's sandbox process, so one
  can use more memory or CPU than it reserved; the run's rlimits (per process) and its
  pids cgroup stay the only hard bound, shared by every instance. A per-agent hard
  bound needs instances in processes of their own (daemon/runtime/README.md).
- `batchable`: acted on in the sandbox: an instance takes up to `max_batch` queued
  calls at once and runs them concurrently, each with an LLM program of its own, so
  their LLM calls meet in the engine's batch; a non-batchable instance runs one call
  at a time.

Each agent type's directives are an `agent.directives` trace event of its run, naming
what is acted on and the run's capacity; each pin a `program.pinned` event of the
pinned program.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from daemon.state import ProgramStatus
from scheduling.agents.policy import ControlView, Directives, InstanceView

if TYPE_CHECKING:
    from daemon.runtime.runs import Run, RunController

_ENDED = (ProgramStatus.STOPPED, ProgramStatus.FAILED)


def instance_program(run_program: str, instance_id: str) -> str:
    """The program an agent instance's LLM calls use (agentd/instances.py's llm key)."""
    return f"{run_program}.{instance_id.replace('#', '.')}"


def instance_programs(run_program: str, inst: InstanceView) -> list[str]:
    """Every program an instance's LLM calls may use: one per batch slot."""
    base = instance_program(run_program, inst.instance_id)
    return [base, *(f"{base}.{slot}" for slot in range(1, inst.slots))]


def not_preemptable(d: Directives) -> bool:
    return d.preemptable is False  # None: the default (preemptable); a str: its method


def acted_on(d: Directives, reserving: bool) -> list[str]:
    """What the directives change, as the `agent.directives` event names it."""
    return [name for name, on in (("kv-pin", not_preemptable(d)),
                                  ("reservation", reserving and bool(d.resources)),
                                  ("batch", d.batchable)) if on]


@dataclass
class DirectiveApplier:
    runs: RunController
    seen: dict[str, dict[str, Directives]] = field(default_factory=dict)

    def reported(self, run: Run, view: ControlView) -> None:
        self._record(run, view)
        pin = {t for t, d in view.agents.items() if not_preemptable(d)}
        for inst in view.instances:
            if inst.agent_type in pin:
                for program in instance_programs(run.program_id, inst):
                    self._pin(run, program, inst.agent_type)

    def forget(self, run: Run) -> None:
        self.seen.pop(run.id, None)

    def _record(self, run: Run, view: ControlView) -> None:
        known = self.seen.setdefault(run.id, {})
        capacity = view.capacity.get("")
        for name, d in view.agents.items():
            if known.get(name) == d:
                continue
            known[name] = d
            self.runs.trace(run, "agent.directives", agent=name, stateful=d.stateful,
                            batchable=d.batchable, max_batch=d.max_batch,
                            preemptable=d.preemptable, min_instances=d.min_instances,
                            max_instances=d.max_instances, resources=dict(d.resources),
                            acted_on=acted_on(d, capacity is not None),
                            capacity=None if capacity is None else dict(capacity),
                            bounded_by_run={k: run.limits[k] for k in ("memory_mb", "cpu_s")})

    def _pin(self, run: Run, program_id: str, agent: str) -> None:
        core = self.runs.core
        program = core.programs.get(program_id)
        if program is None or program.pinned or program.status in _ENDED:
            return
        program.pinned = True
        core.writer.update("programs", program_id, pinned=True)
        core.writer.trace("program.pinned", session_id=program.session_id,
                          program_id=program_id, run_id=run.id, agent=agent,
                          reason=f"agent {agent} is not preemptable")
