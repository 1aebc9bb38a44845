"""`agentd_tool_*` metric families for /metrics, from the tool manager's numbers."""

from __future__ import annotations

from typing import Any

from daemon.metrics import Exposition

_HISTOGRAMS = (
    ("agentd_tool_prepare_seconds", "prepare_seconds",
     "Time to prepare a tool environment (create, start, setup steps)"),
    ("agentd_tool_exec_seconds", "exec_seconds", "Time a tool command ran"),
    ("agentd_tool_exec_wait_seconds", "exec_wait_seconds",
     "Time a tool call waited for its environment: setup not hidden by preparing ahead"),
)
_COUNTERS = (
    ("agentd_tool_prepares_total", "prepares_total", "outcome", "Preparations by outcome"),
    ("agentd_tool_execs_total", "execs_total", "outcome", "Tool calls by outcome"),
    ("agentd_tool_released_total", "released_total", "resource",
     "Containers, volumes and directories removed"),
)


def write(out: Exposition, counters: dict[str, Any], usage: dict[str, Any] | None,
          backends: list[str]) -> None:
    """`counters` from `ToolMetrics.snapshot()`; `usage` from `ToolManager.usage()`, None
    before the first one is known (those families are then left out, not reported as 0)."""
    for name, key, label, help_text in _COUNTERS:
        out.family(name, "counter", help_text)
        for value, n in sorted(counters[key].items()):
            out.sample(name, n, **{label: value})
    for name, key, help_text in _HISTOGRAMS:
        _histogram(out, name, help_text, counters[key])
    if usage is not None:
        _usage(out, usage, backends)


def _usage(out: Exposition, usage: dict[str, Any], backends: list[str]) -> None:
    out.family("agentd_tool_resources", "gauge", "Tool resources held, by kind and state")
    for row in usage["resources"]:
        out.sample("agentd_tool_resources", row["count"], backend=row["backend"],
                   resource=row["resource"], state=row["state"] or "unknown")
    out.family("agentd_tool_disk_bytes", "gauge", "Disk used by tool containers and volumes")
    out.sample("agentd_tool_disk_bytes", usage["disk_bytes"])
    out.family("agentd_tool_programs", "gauge", "Programs holding tool resources")
    out.sample("agentd_tool_programs", usage["programs_holding"])
    out.family("agentd_tool_backend_up", "gauge", "Whether a tool backend's engine answers")
    for backend in backends:
        out.sample("agentd_tool_backend_up", int(backend not in usage["backends_down"]),
                   backend=backend)


def _histogram(out: Exposition, name: str, help_text: str, snap: dict[str, Any]) -> None:
    out.family(name, "histogram", help_text)
    for bound, count in snap["buckets"].items():
        out.sample(f"{name}_bucket", count, le="+Inf" if bound == "inf" else bound)
    out.sample(f"{name}_sum", snap["sum"])
    out.sample(f"{name}_count", snap["count"])
