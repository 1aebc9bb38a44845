"""`agentd_tool_*` in Prometheus text, from the manager's counters and usage."""

from __future__ import annotations

import re

from daemon.metrics import DaemonMetrics
from daemon.toolsvc.metrics import families
from tools.metrics import ToolMetrics

_SAMPLE = re.compile(r"^([a-z_:]+)(\{[^}]*\})? (\S+)$")


def parse(text: str) -> dict[str, float]:
    samples = {}
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        assert match, f"not a Prometheus sample line: {line!r}"
        samples[match[1] + (match[2] or "")] = float(match[3])
    return samples


def test_tool_metrics_render_every_family() -> None:
    counters = ToolMetrics()
    counters.prepares["ok"] += 2
    counters.prepares["unknown_image"] += 1
    counters.execs["timeout"] += 1
    counters.releases["container"] += 3
    for seconds in (0.4, 2.2):
        counters.prepare_seconds.observe(seconds)
    counters.exec_seconds.observe(0.02)
    usage = {
        "resources": [{"backend": "docker", "resource": "container", "state": "running",
                       "count": 2},
                      {"backend": "docker", "resource": "volume", "state": "", "count": 1}],
        "disk_bytes": 4096, "programs_holding": 2, "backends_down": ["process"],
    }
    metrics = DaemonMetrics()
    metrics.add(lambda: families(counters.snapshot(), usage, ["docker", "process"]))
    text = metrics.render().decode()
    m = parse(text)
    assert m['agentd_tool_resources{backend="docker",resource="container",state="running"}'] == 2
    assert m['agentd_tool_resources{backend="docker",resource="volume",state="unknown"}'] == 1
    assert m["agentd_tool_disk_bytes"] == 4096 and m["agentd_tool_programs"] == 2
    assert m['agentd_tool_backend_up{backend="docker"}'] == 1
    assert m['agentd_tool_backend_up{backend="process"}'] == 0
    assert m['agentd_tool_prepares_total{outcome="unknown_image"}'] == 1
    assert m['agentd_tool_execs_total{outcome="timeout"}'] == 1
    assert m['agentd_tool_released_total{resource="container"}'] == 3
    assert m['agentd_tool_prepare_seconds_bucket{le="0.5"}'] == 1
    assert m['agentd_tool_prepare_seconds_bucket{le="+Inf"}'] == 2
    assert m["agentd_tool_prepare_seconds_count"] == 2
    assert abs(m["agentd_tool_prepare_seconds_sum"] - 2.6) < 1e-9
    assert m["agentd_tool_exec_wait_seconds_count"] == 0
    for family in ("prepare_seconds", "exec_seconds", "exec_wait_seconds"):
        assert f"# TYPE agentd_tool_{family} histogram" in text


def test_usage_families_wait_for_the_first_reading() -> None:
    metrics = DaemonMetrics()
    metrics.add(lambda: families(ToolMetrics().snapshot(), None, ["docker"]))
    text = metrics.render().decode()
    assert "agentd_tool_exec_seconds_count 0" in text
    assert "agentd_tool_disk_bytes" not in text and "agentd_tool_backend_up" not in text
