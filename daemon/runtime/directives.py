"""What the daemon does with an agent's directives (NALAR Table 1), learnt from the view
its run's sandbox reports (`agents`), once per agent type and run.

- `preemptable=False`: the agent's work must not be preempted, so each of its instances'
  programs (`<run program>.<Agent>.<i>`, the program an instance's LLM calls use, see
  agentd/control.py) gets the KV layer's pin hint: the KV policy never pauses a pinned
  program, so its KV cache stays on its worker between calls. Programs an instance
  creates later are pinned at the next report (every 0.25 s). Undeclared (None) or a
  preempt method's name: no hint.
- `resources` (`memory_mb`, `CPU`, `GPU`): recorded, not enforced per agent. An agent
  instance is a thread of its run's sandbox process, so the run's limits (rlimits per
  process, pids cgroup) bound every instance together; a per-agent bound needs instances
  in processes of their own (see daemon/runtime/README.md).
- `batchable`: recorded, not acted on. An instance runs one call at a time and the engine
  already batches the LLM calls of every instance; what the directive would change is an
  instance taking several queued calls at once, which is the sandbox's local controller's
  part, not the daemon's.

Each agent type's directives are an `agent.directives` trace event of its run, naming
what the daemon acted on; each pin a `program.pinned` event of the pinned program.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from daemon.state import ProgramStatus
from scheduling.control import ControlView, Directives

if TYPE_CHECKING:
    from daemon.runtime.runs import Run, RunController

_ENDED = (ProgramStatus.STOPPED, ProgramStatus.FAILED)


def instance_program(run_program: str, instance_id: str) -> str:
    """The program an agent instance's LLM calls use (agentd/control.py's llm key)."""
    return f"{run_program}.{instance_id.replace('#', '.')}"


def not_preemptable(d: Directives) -> bool:
    return d.preemptable is False  # None: the default (preemptable); a str: its method


@dataclass
class DirectiveApplier:
    runs: RunController
    seen: dict[str, dict[str, Directives]] = field(default_factory=dict)

    def reported(self, run: Run, view: ControlView) -> None:
        self._record(run, view)
        pin = {t for t, d in view.agents.items() if not_preemptable(d)}
        for inst in view.instances:
            if inst.agent_type in pin:
                self._pin(run, instance_program(run.program_id, inst.instance_id),
                          inst.agent_type)

    def forget(self, run: Run) -> None:
        self.seen.pop(run.id, None)

    def _record(self, run: Run, view: ControlView) -> None:
        known = self.seen.setdefault(run.id, {})
        for name, d in view.agents.items():
            if known.get(name) == d:
                continue
            known[name] = d
            self.runs.trace(run, "agent.directives", agent=name, stateful=d.stateful,
                            batchable=d.batchable, preemptable=d.preemptable,
                            min_instances=d.min_instances, max_instances=d.max_instances,
                            resources=dict(d.resources),
                            acted_on=["kv-pin"] if not_preemptable(d) else [],
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
