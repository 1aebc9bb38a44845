"""How the daemon finds the control hooks' events in a run's successive views, and which
agent instance program the KV pin hint goes to."""

from __future__ import annotations

from daemon.runtime.directives import instance_program, not_preemptable
from daemon.runtime.hooks import InstanceWatch
from scheduling.agents.policy import ControlView, Directives, InstanceState, InstanceView

A, D, S, X = (InstanceState.ACTIVE, InstanceState.DRAINING, InstanceState.STARTING,
              InstanceState.DEAD)


def _view(**states: InstanceState) -> ControlView:
    return ControlView((), [InstanceView(i.replace("_", "#"), "W", state=s)
                            for i, s in states.items()], {})


def test_instances_start_are_killed_stop_and_die_with_their_run() -> None:
    w = InstanceWatch()
    assert w.diff("r1", _view(W_0=A)) == [("W#0", "started")]
    assert w.diff("r1", _view(W_0=A)) == []
    assert w.diff("r1", _view(W_0=A, W_1=S)) == [("W#1", "started")]
    assert w.diff("r1", _view(W_0=A, W_1=A)) == [("W#1", "active")]
    assert w.diff("r1", _view(W_0=A, W_1=D)) == [("W#1", "killed")]
    assert w.diff("r1", _view(W_0=A)) == [("W#1", "stopped")]
    assert w.diff("r2", _view(W_0=A)) == [("W#0", "started")]  # runs are apart
    assert w.diff("r1", _view(W_0=X)) == [("W#0", "stopped")]
    assert w.diff("r1", _view()) == []  # a dead instance leaving the view stopped already
    assert w.ended("r2", "died") == [("W#0", "died")]
    assert w.ended("r2", "died") == []


def test_the_pin_hint_goes_to_the_instances_llm_program() -> None:
    assert instance_program("prog-1", "Keeper#0") == "prog-1.Keeper.0"
    assert instance_program("prog-1", "Keeper~2#3") == "prog-1.Keeper~2.3"
    assert not_preemptable(Directives(preemptable=False))
    assert not not_preemptable(Directives())  # undeclared: no hint
    assert not not_preemptable(Directives(preemptable="stop"))
