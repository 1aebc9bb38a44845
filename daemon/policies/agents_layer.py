"""The global controller (NALAR) as a stored-policy layer: `control`.

A version is a `scheduling.agents.policy.ControlPolicy`. Its dry run checks that `decide` and
both hooks return decisions the view allows (what the global controller would reject,
the dry run refuses: a sound policy decides only what its view permits) and that its
`period_s` is one the loop can keep. The snapshots are the fixed sample view
(scheduling/control_policies) and the daemon's live joined view of the runs now
reporting (daemon/runtime/global_controller.py, `ControlLoop.snapshot`), empty when none does.
The daemon runs the active version through `ControlGuard` (daemon/policies/agents_guard.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from daemon.policies.layer_spec import DryCall, Layer
from scheduling.agents.policies import CONTROL_POLICIES, sample_view
from scheduling.agents.policy import ControlDecision, ControlPolicy, ControlView, Validator

DEFAULT_CONTROL_POLICY = "nalar-default"
# The loop sleeps a period between steps: shorter would keep a core busy for little,
# longer would leave imbalance in place for a minute.
MIN_PERIOD_S, MAX_PERIOD_S = 0.05, 60.0
FALLBACK_PERIOD_S = 0.5
HOOK_CALLS = 8  # instances and sessions each hook is dry-run for
LIVE_RUNS = 8  # runs joined into the live snapshot (each run's names are its own)


def period_problem(value: object) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return f"period_s must be a number of seconds, got {value!r}"
    if not MIN_PERIOD_S <= value <= MAX_PERIOD_S:
        return f"period_s must be within {MIN_PERIOD_S}..{MAX_PERIOD_S} s, got {value}"
    return None


def period_of(policy: Any) -> float:
    """The policy's period, or the default for a value validation would have refused."""
    value = getattr(policy, "period_s", FALLBACK_PERIOD_S)
    return float(value) if period_problem(value) is None else FALLBACK_PERIOD_S


def refused(decisions: object, view: ControlView, what: str) -> str | None:
    """Why `decisions` is not a list the global controller would accept in full."""
    if not isinstance(decisions, list):
        return f"{what} must return a list of decisions, got {type(decisions).__name__}"
    checker = Validator(view)
    for d in decisions:
        if not isinstance(d, ControlDecision):
            return (f"{what} must return Route / WeightedRoute / SetPriority / Migrate / "
                    f"Kill / Provision decisions, got {type(d).__name__}")
        problem = checker.check(d)
        if problem is not None:
            return f"{what} returned a decision its view refuses ({d!r}): {problem}"
    return None


def control_dry_calls(view: ControlView, now: float) -> list[DryCall]:
    calls: list[DryCall] = [
        ("period_s", lambda p: period_problem(p.period_s)),
        ("decide", lambda p: refused(p.decide(view, now), view, "decide")),
    ]
    for inst in view.instances[:HOOK_CALLS]:
        calls.append(_hook(view, now, "on_instance_change", inst.instance_id))
    for session in list(view.sessions)[:HOOK_CALLS]:
        calls.append(_hook(view, now, "on_session_end", session))
    return calls


def _hook(view: ControlView, now: float, hook: str, arg: str) -> DryCall:
    def call(p: Any) -> str | None:
        return refused(getattr(p, hook)(view, arg, now), view, hook)
    return f"{hook}({arg})", call


def _live(core: Any) -> ControlView:
    loop = getattr(core, "control", None)
    return ControlView((), (), {}) if loop is None else loop.snapshot(LIVE_RUNS)


def _install(core: Any, active: Any, on_failure: Callable[[Any], None]) -> Any:
    # runtime.control_guard imports policies.swap, which imports this module via layers
    from daemon.policies.agents_guard import ControlGuard

    guard = ControlGuard(active, on_failure=on_failure)
    loop = getattr(core, "control", None)
    if loop is not None:
        loop.install(guard)
    return guard


CONTROL_LAYER = Layer(
    "control", ControlPolicy, ("decide", "on_instance_change", "on_session_end"),
    CONTROL_POLICIES, control_dry_calls, sample=sample_view, live=_live, install=_install,
    default=lambda _config: DEFAULT_CONTROL_POLICY,
)

__all__ = ["CONTROL_LAYER", "DEFAULT_CONTROL_POLICY", "control_dry_calls", "period_of",
           "period_problem", "refused"]
