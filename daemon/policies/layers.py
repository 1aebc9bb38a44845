"""The scheduling layers a stored policy can belong to, and how each one is checked.

Generic over layers (see daemon/policies/layer_spec.py): `kv` is defined here, the SLO
layers `ordering`, `meta` and `admission` in daemon/policies/slo_layers.py, the global
controller's `control` in daemon/policies/agents_layer.py.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from daemon.policies.agents_layer import CONTROL_LAYER
from daemon.policies.layer_spec import DryCall, Layer
from daemon.policies.slo_layers import SLO_LAYERS
from scheduling.kv import (
    KV_POLICIES,
    Decision,
    KvConfig,
    KvPolicy,
    KvView,
    ProgramStatus,
    ProgramView,
    WorkerView,
)
from scheduling.kv.registry import agentd_options

__all__ = ["LAYERS", "DryCall", "Layer", "kv_dry_calls", "sample_kv_view"]


def _decisions(value: object, what: str) -> str | None:
    if not isinstance(value, list) or not all(isinstance(d, Decision) for d in value):
        return f"{what} must return a list of Decision, got {type(value).__name__}"
    return None


def _worker(value: object, view: KvView) -> str | None:
    if value is None or (isinstance(value, str) and view.worker(value) is not None):
        return None
    return f"route must return a known worker id or None, got {value!r}"


def kv_dry_calls(view: KvView, now: float, max_programs: int = 16) -> list[DryCall]:
    calls: list[DryCall] = [("decide", lambda p: _decisions(p.decide(view, now), "decide"))]
    for program in view.programs[:max_programs]:
        calls += _program_calls(view, program.program_id, now)
    return calls


def _program_calls(view: KvView, pid: str, now: float) -> list[DryCall]:
    def route(p: Any) -> str | None:
        return _worker(p.route(view, pid, now), view)

    def end(p: Any) -> str | None:
        return _decisions(p.on_request_end(view, pid, now), "on_request_end")

    return [(f"route({pid})", route), (f"on_request_end({pid})", end)]


def sample_kv_view(now: float) -> KvView:
    """A small fixed snapshot, so a policy is exercised even when the daemon is idle."""
    workers = (WorkerView("w-a", 8192, 5000), WorkerView("w-b", 8192, 1000))
    programs = (
        ProgramView("p-run", ProgramStatus.REASONING, 3000, now - 20, "w-a"),
        ProgramView("p-tool", ProgramStatus.ACTING, 2000, now - 15, "w-a",
                    acting_since=now - 3, tool_time_mean_s=1.5),
        ProgramView("p-new", ProgramStatus.QUEUED, 900, now - 1, ready_since=now - 1,
                    pending_request=True),
        ProgramView("p-paused", ProgramStatus.PAUSED, 1200, now - 30, "w-b",
                    ready_since=now - 4, pending_request=True),
    )
    return KvView(workers, programs, KvConfig())


def _install_kv(core: Any, active: Any, on_failure: Callable[[Any], None]) -> Any:
    from daemon.policies.swap import GuardedKvPolicy  # swap imports validate, which imports us

    guard = GuardedKvPolicy(active, on_failure=on_failure)
    core.kv.policy = guard
    return guard


KV_LAYER = Layer(
    "kv", KvPolicy, ("decide", "route", "on_request_end"), KV_POLICIES, kv_dry_calls,
    sample=sample_kv_view, live=lambda core: core.kv.view(), install=_install_kv,
    default=lambda config: str(config.kv_policy),
    # The configured [kv_options] tune the built-in agentd, as at start (daemon/kv/loop.py).
    tuning=lambda name, core: ({"options": agentd_options(name, core.config.kv_options)}
                               if name == "agentd" and core.config.kv_options else {}),
)

LAYERS: dict[str, Layer] = {"kv": KV_LAYER, **SLO_LAYERS, "control": CONTROL_LAYER}
