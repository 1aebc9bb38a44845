"""`agentd_tool_*` metric families for /metrics, from the tool manager's numbers."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client.metrics_core import Metric

from daemon.metrics import gauge, histogram, labelled_counter, labelled_gauge

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


def families(counters: dict[str, Any], usage: dict[str, Any] | None,
             backends: list[str]) -> Iterator[Metric]:
    """`counters` from `ToolMetrics.snapshot()`; `usage` from `ToolManager.usage()`, None
    before the first one is known (those families are then left out, not reported as 0)."""
    for name, key, label, help_text in _COUNTERS:
        yield labelled_counter(name, help_text, [label],
                               [([value], n) for value, n in sorted(counters[key].items())])
    for name, key, help_text in _HISTOGRAMS:
        snap = counters[key]
        cumulative = {"+Inf" if bound == "inf" else bound: count
                      for bound, count in snap["buckets"].items()}
        yield histogram(name, help_text, cumulative, snap["sum"])
    if usage is not None:
        yield from _usage(usage, backends)


def _usage(usage: dict[str, Any], backends: list[str]) -> Iterator[Metric]:
    yield labelled_gauge(
        "agentd_tool_resources", "Tool resources held, by kind and state",
        ["backend", "resource", "state"],
        [([row["backend"], row["resource"], row["state"] or "unknown"], row["count"])
         for row in usage["resources"]])
    yield gauge("agentd_tool_disk_bytes", "Disk used by tool containers and volumes",
                usage["disk_bytes"])
    yield gauge("agentd_tool_programs", "Programs holding tool resources",
                usage["programs_holding"])
    yield labelled_gauge(
        "agentd_tool_backend_up", "Whether a tool backend's engine answers", ["backend"],
        [([backend], int(backend not in usage["backends_down"])) for backend in backends])
    yield labelled_gauge(
        "agentd_tool_host_up", "Whether a Docker engine of the tool pools answered the last "
        "listing", ["host"],
        [([host], int(host not in usage.get("hosts_down", ()))) for host in usage.get("hosts", ())])
