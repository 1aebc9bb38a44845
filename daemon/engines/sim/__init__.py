"""The simulated engine: a model of vLLM v1's scheduler, paged KV cache and step time.

``SimEngine`` runs it in wall-clock time behind the worker's ``Engine`` interface;
``VirtualDriver`` runs the same ``SimScheduler`` in virtual time for trace replay. All of its
output is filler text (``sim0 sim1 ...``): it is always labelled as simulated.
"""

from daemon.engines.sim.cost import DEFAULT_COST_MODEL, CostModel, load_cost_model
from daemon.engines.sim.engine import SimEngine, request_from_submit
from daemon.engines.sim.scheduler import (
    RequestOutput,
    RequestRejected,
    SchedulerConfig,
    SimRequest,
    SimScheduler,
    StepResult,
)
from daemon.engines.sim.virtual import RequestTiming, TimedStep, VirtualClock, VirtualDriver

__all__ = [
    "DEFAULT_COST_MODEL",
    "CostModel",
    "RequestOutput",
    "RequestRejected",
    "RequestTiming",
    "SchedulerConfig",
    "SimEngine",
    "SimRequest",
    "SimScheduler",
    "StepResult",
    "TimedStep",
    "VirtualClock",
    "VirtualDriver",
    "load_cost_model",
    "request_from_submit",
]
