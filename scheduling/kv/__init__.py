"""Program-aware KV scheduling: which programs hold KV on which worker.

The daemon builds a `KvView`, calls `decide` every `check_interval_s`, `route`
when a program's request is ready, and `on_request_end` after each request, and
applies the returned decisions in order.
"""

from scheduling.kv.agentd import AgentdOptions, AgentdPolicy
from scheduling.kv.autellix import AutellixPlasPolicy, PlasOptions
from scheduling.kv.baselines import ContinuumTtlPolicy, StickyPolicy, VllmDefaultPolicy
from scheduling.kv.decisions import Admit, Decision, MarkPauseAfterRequest, Pause, Restore
from scheduling.kv.ledger import decay
from scheduling.kv.migration import MigrationPlan, plan_migration
from scheduling.kv.policy import KvPolicy
from scheduling.kv.prefix_router import PrefixRouterOptions, PrefixRouterPolicy
from scheduling.kv.registry import KV_POLICIES, make_kv_policy
from scheduling.kv.residency import ResidencyEstimator
from scheduling.kv.thunder import ThunderAgentPolicy
from scheduling.kv.view import KvConfig, KvView, ProgramStatus, ProgramView, WorkerView

__all__ = [
    "KV_POLICIES",
    "Admit",
    "AgentdOptions",
    "AgentdPolicy",
    "AutellixPlasPolicy",
    "ContinuumTtlPolicy",
    "Decision",
    "KvConfig",
    "KvPolicy",
    "KvView",
    "MarkPauseAfterRequest",
    "MigrationPlan",
    "Pause",
    "PlasOptions",
    "PrefixRouterOptions",
    "PrefixRouterPolicy",
    "ProgramStatus",
    "ProgramView",
    "ResidencyEstimator",
    "Restore",
    "StickyPolicy",
    "ThunderAgentPolicy",
    "VllmDefaultPolicy",
    "WorkerView",
    "decay",
    "make_kv_policy",
    "plan_migration",
]
