"""Virtual-time trace replay: the daemon's own scheduling against simulated workers.

``replay(specs, config, Hardware(...), Workload(...))`` gives one result row;
``agentd replay`` (``replay_main``) runs several configurations side by side.
"""

from daemon.replay.cli import add_replay_parser, replay_main
from daemon.replay.synthetic import AgentShape, fit_tracelab, synthetic_programs
from daemon.replay.traces import load_trace
from daemon.replay.virtual import Hardware, Workload, replay
from daemon.replay.workload import ProgramSpec, StepSpec

__all__ = [
    "AgentShape",
    "Hardware",
    "ProgramSpec",
    "StepSpec",
    "Workload",
    "add_replay_parser",
    "fit_tracelab",
    "load_trace",
    "replay",
    "replay_main",
    "synthetic_programs",
]
