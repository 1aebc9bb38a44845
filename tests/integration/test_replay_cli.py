"""``python -m daemon.replay`` as a subprocess on a small synthetic run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

FIELDS = {"policy", "ordering", "throughput_steps_per_min", "output_tokens_per_s",
          "program_latency_s", "prefix_hit_rate", "recomputed_prompt_tokens", "paused_share",
          "kv_imbalance", "goodput_rps", "esg", "slo_attainment", "ttft_compliance",
          "tpot_compliance", "ttft_s", "policy_switches", "rollbacks", "simulated", "wall_s"}


def test_replay_cli_writes_json(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    proc = subprocess.run(
        [sys.executable, "-m", "daemon.replay", "--synthetic-agents", "6", "--concurrency", "3",
         "--policy", "vllm-default,agentd", "--ordering", "fcfs", "--kv-tokens", "200000",
         "--cost-model", "llama3-8b-h100",
         "--json", str(out)],
        capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    data = json.loads(out.read_text())
    assert data["params"]["synthetic_agents"] == 6 and data["params"]["simulated"] is True
    assert [r["policy"] for r in data["results"]] == ["vllm-default", "agentd"]
    for row in data["results"]:
        assert set(row) >= FIELDS and row["simulated"] is True
        assert row["completed_programs"] == 6 and row["throughput_steps_per_min"] > 0


def test_replay_cli_rejects_missing_trace() -> None:
    proc = subprocess.run([sys.executable, "-m", "daemon.replay"], capture_output=True,
                          text=True, timeout=30)
    assert proc.returncode == 2 and "TRACE_FILE" in proc.stderr
