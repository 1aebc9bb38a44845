"""The [slo.llm] and [slo.tenants] config tables (daemon/slo/settings.py reads the rest);
every error is a ValueError naming its key."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from daemon.access.names import tenant_problem
from scheduling.slo.templates import Slo, TaskType

MAX_LLM_TOKENS = 1024


@dataclass(frozen=True)
class LlmSettings:
    """The meta-llm call (daemon/slo/llm.py)."""

    model: str = ""  # empty: the model of the first healthy worker, by name
    # 0: 80% of meta_interval_s, so an answer (or its failure) is in before the next decision.
    timeout_s: float = 0.0
    max_tokens: int = 128  # the schema's longest reply, at one token per character


DEFAULT_LLM = LlmSettings()


def number(key: str, value: Any, kind: type) -> Any:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"config key '{key}' must be a number, got {value!r}")
    if kind is int and value != int(value):
        raise ValueError(f"config key '{key}' must be a whole number, got {value!r}")
    return kind(value)


def parse_llm(raw: Any) -> LlmSettings:
    table = _mapping("slo.llm", raw, {"model", "timeout_s", "max_tokens"})
    model = table.get("model", "")
    if not isinstance(model, str) or len(model) > 256:
        raise ValueError(f"config key 'slo.llm.model' must be a model name, got {model!r}")
    timeout = number("slo.llm.timeout_s", table.get("timeout_s", 0.0), float)
    if timeout < 0:
        raise ValueError("config key 'slo.llm.timeout_s' must be >= 0 (0: 80% of "
                         "meta_interval_s)")
    tokens = number("slo.llm.max_tokens", table.get("max_tokens", DEFAULT_LLM.max_tokens), int)
    if not 1 <= tokens <= MAX_LLM_TOKENS:
        raise ValueError(f"config key 'slo.llm.max_tokens' must be 1-{MAX_LLM_TOKENS}")
    return LlmSettings(model, timeout, tokens)


def parse_tenants(raw: Any) -> tuple[dict[str, float], dict[str, dict[TaskType, Slo]]]:
    """(WFQ/stride weight per tenant, SLO per task per tenant) from [slo.tenants]."""
    weights: dict[str, float] = {}
    slos: dict[str, dict[TaskType, Slo]] = {}
    for name, entry in _mapping("slo.tenants", raw, None).items():
        key = f"slo.tenants.{name}"
        problem = tenant_problem(name)
        if problem is not None:
            raise ValueError(f"config key '{key}': {problem}")
        # program_idle_timeout_s: read by daemon/core/expiry.py (scheduling/kv/idle.py);
        # content_tracing: by daemon/content/settings.py
        table = _mapping(key, entry, {"weight", "slo", "program_idle_timeout_s",
                                      "content_tracing"})
        if "weight" in table:
            weights[name] = number(f"{key}.weight", table["weight"], float)
            if not weights[name] > 0:
                raise ValueError(f"config key '{key}.weight' must be > 0")
        if "slo" in table:
            slos[name] = _task_slos(f"{key}.slo", table["slo"])
    return weights, slos


def _task_slos(key: str, raw: Any) -> dict[TaskType, Slo]:
    tasks = {t.value: t for t in TaskType}
    out: dict[TaskType, Slo] = {}
    for task, entry in _mapping(key, raw, set(tasks)).items():
        fields = _mapping(f"{key}.{task}", entry, {"ttft_ms", "tpot_ms"})
        if set(fields) != {"ttft_ms", "tpot_ms"}:
            raise ValueError(f"config key '{key}.{task}' must be {{ ttft_ms = N, tpot_ms = N }}")
        ttft, tpot = (number(f"{key}.{task}.{f}", fields[f], float) for f in ("ttft_ms", "tpot_ms"))
        if not (ttft > 0 and tpot > 0):
            raise ValueError(f"config key '{key}.{task}' needs ttft_ms and tpot_ms > 0")
        out[tasks[task]] = Slo(ttft / 1000.0, tpot / 1000.0)
    return out


def _mapping(key: str, raw: Any, known: set[str] | None) -> Mapping[str, Any]:
    if not isinstance(raw, Mapping):
        raise ValueError(f"config key '{key}' must be a table")
    unknown = sorted(set(raw) - known) if known is not None else []
    if unknown:
        raise ValueError(f"config key '{key}.{unknown[0]}' is unknown; "
                         f"known: {sorted(known or ())}")
    return raw
