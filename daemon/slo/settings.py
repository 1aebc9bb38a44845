"""The daemon's SLO scheduling settings: which policies start, and the config's [slo] table.

Config keys (daemon/config.py): `ordering_policy` (a pool policy, default fcfs),
`meta_policy` (meta-rules | meta-bandit | meta-llm, also spelt llm | off | a pool policy
to run fixed), `admission_policy` (statera | unbounded), `meta_interval_s`, and the TOML
table

    [slo]          cycle_s, short_window_s, long_window_s, delta_frag
    [slo.rules]    fields of scheduling.slo.meta.RuleThresholds (the meta-rules built-in)
    [slo.guard]    fields of scheduling.slo.meta.GuardConfig (rollback guard, emergency bypass)
    [slo.llm]      the meta-llm call (LlmSettings)
    [slo.tenants.NAME]      weight = W (WFQ/stride share; default 1); program_idle_timeout_s =
                   S (that tenant's idle programs end after S s, 0: never; daemon/core/expiry.py)
    [slo.tenants.NAME.slo]  TASK = { ttft_ms = N, tpot_ms = N }: that tenant's SLO for a
                   task type of scheduling/slo/templates.py, instead of Table 6's

These choose what starts when the store has no active version for a layer; after that
the stored active versions win, as for `kv_policy`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from daemon.policies.slo_layers import META_ALIASES, META_OFF, ORDERING_POOL
from daemon.slo.tables import DEFAULT_LLM, LlmSettings, number, parse_llm, parse_tenants
from scheduling.layers import ADMISSION_POLICIES, META_POLICIES
from scheduling.slo.meta import SERVING_GUARD, SERVING_RULES, GuardConfig, RuleThresholds
from scheduling.slo.templates import Slo, TaskType


@dataclass(frozen=True)
class SloSettings:
    cycle_s: float = 0.5  # the stability agent's and the guards' period
    short_window_s: float = 5.0
    long_window_s: float = 60.0
    delta_frag: float = 0.1
    rules: RuleThresholds = SERVING_RULES
    guard: GuardConfig = SERVING_GUARD
    llm: LlmSettings = DEFAULT_LLM
    tenant_weights: Mapping[str, float] = field(default_factory=dict)
    tenant_slos: Mapping[str, Mapping[TaskType, Slo]] = field(default_factory=dict)


_NUMBERS = ("cycle_s", "short_window_s", "long_window_s", "delta_frag")
_TABLES: dict[str, Any] = {"rules": RuleThresholds, "guard": GuardConfig}


def parse_settings(raw: Mapping[str, Any]) -> SloSettings:
    """Settings from the [slo] table; ValueError naming the key on a bad one."""
    values: dict[str, Any] = {}
    for key, value in raw.items():
        if key in _TABLES:
            values[key] = _table(key, value, getattr(SloSettings, key))
        elif key == "llm":
            values["llm"] = parse_llm(value)
        elif key == "tenants":
            values["tenant_weights"], values["tenant_slos"] = parse_tenants(value)
        elif key in _NUMBERS:
            values[key] = number(f"slo.{key}", value, float)
        else:
            known = sorted([*_NUMBERS, *_TABLES, "llm", "tenants"])
            raise ValueError(f"config key 'slo.{key}' is unknown; known: {known}")
    for key in ("cycle_s", "short_window_s", "long_window_s"):
        if key in values and values[key] <= 0:
            raise ValueError(f"config key 'slo.{key}' must be > 0")
    if not 0 <= values.get("delta_frag", 0.1) < 1:
        raise ValueError("config key 'slo.delta_frag' must be in [0, 1)")
    return SloSettings(**values)


def _table(name: str, raw: Any, default: Any) -> Any:
    """`default` with the keys of the [slo.NAME] table replaced."""
    if not isinstance(raw, Mapping):
        raise ValueError(f"config key 'slo.{name}' must be a table")
    known = {f.name: f for f in dataclasses.fields(default)}
    values = {}
    for key, value in raw.items():
        if key not in known:
            raise ValueError(f"config key 'slo.{name}.{key}' is unknown; known: {sorted(known)}")
        kind = int if isinstance(getattr(default, key), int) else float
        values[key] = number(f"slo.{name}.{key}", value, kind)
    return dataclasses.replace(default, **values)




def config_problem(config: Any) -> str | None:
    """The first bad SLO config value, as one line naming the key; None when all are fine."""
    metas = sorted([*META_POLICIES, *META_ALIASES, META_OFF, *ORDERING_POOL])
    if config.ordering_policy not in ORDERING_POOL:
        return f"ordering_policy must be one of {', '.join(ORDERING_POOL)}, " \
               f"got {config.ordering_policy!r}"
    if config.meta_policy not in metas:
        return f"meta_policy must be one of {', '.join(metas)}, got {config.meta_policy!r}"
    if config.admission_policy not in ADMISSION_POLICIES:
        return f"admission_policy must be one of {', '.join(sorted(ADMISSION_POLICIES))}, " \
               f"got {config.admission_policy!r}"
    if config.meta_interval_s <= 0:
        return f"meta_interval_s must be > 0, got {config.meta_interval_s}"
    try:
        parse_settings(config.slo)
    except ValueError as exc:
        return str(exc)
    return None
