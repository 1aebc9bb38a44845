"""Virtual-time trace replay: the scheduling stack against simulated workers.

``Replay(specs, ReplayConfig(...), make_kv_policy(name), slo_stack(name)).run()`` gives one
result row; ``agentd replay`` (``replay_main``) runs several side by side.
"""

from daemon.replay.cli import add_replay_parser, replay_main
from daemon.replay.harness import UNLIMITED_KV, Replay, ReplayConfig
from daemon.replay.slo import SloStack, slo_stack
from daemon.replay.synthetic import AgentShape, fit_tracelab, synthetic_programs
from daemon.replay.traces import load_trace
from daemon.replay.workload import ProgramSpec, StepSpec

__all__ = [
    "UNLIMITED_KV",
    "AgentShape",
    "ProgramSpec",
    "Replay",
    "ReplayConfig",
    "SloStack",
    "StepSpec",
    "add_replay_parser",
    "fit_tracelab",
    "load_trace",
    "replay_main",
    "slo_stack",
    "synthetic_programs",
]
