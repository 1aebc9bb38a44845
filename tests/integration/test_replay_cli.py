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


def _oversized_trace(path: Path, big_prompt: int) -> Path:
    rows = [
        {"program_id": "a", "step": 0, "arrival_s": 0, "prompt_tokens": 500, "output_tokens": 20},
        {"program_id": "a", "step": 1, "prompt_tokens": 700, "output_tokens": 20, "tool_s": 1},
        {"program_id": "big", "step": 0, "arrival_s": 0.5, "prompt_tokens": big_prompt,
         "output_tokens": 20},
        {"program_id": "c", "step": 0, "arrival_s": 1, "prompt_tokens": 300,
         "output_tokens": 20},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _replay(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "daemon.replay", *args],
                          capture_output=True, text=True, timeout=60)


def test_replay_refuses_a_request_no_worker_can_hold_and_finishes(tmp_path: Path) -> None:
    # 9,000 tokens against 4,096 of KV: the daemon refuses it at submit (every policy;
    # a program-aware one would otherwise hold it forever). 132,000 tokens against
    # 140,000 of KV: past the model length (131,072), the engine refuses it when sent.
    for big, kv in ((9000, 4096), (132_000, 140_000)):
        trace = _oversized_trace(tmp_path / f"t{big}.jsonl", big)
        out = tmp_path / f"r{big}.json"
        proc = _replay(str(trace), "--kv-tokens", str(kv), "--policy", "vllm-default,agentd",
                       "--json", str(out))
        assert proc.returncode == 0, proc.stderr
        assert "refused a request of big" in proc.stderr
        for row in json.loads(out.read_text())["results"]:
            assert row["refused"] == 1, (big, row["policy"])
            assert row["completed_programs"] == 2 and row["completed_steps"] == 3
            assert row["unserved_requests"] == 0


def test_replay_prints_progress_with_an_eta_unless_quiet(tmp_path: Path) -> None:
    args = ["--synthetic-agents", "4", "--concurrency", "2", "--policy", "agentd",
            "--kv-tokens", "200000", "--cost-model", "llama3-8b-h100", "--duration-s", "60",
            "--json", str(tmp_path / "r.json")]
    proc = _replay(*args, "--progress-every", "0.001")
    assert proc.returncode == 0, proc.stderr
    line = next(ln for ln in proc.stderr.splitlines() if ln.startswith("[replay agentd]"))
    assert "/60s requests" in line and "ETA" in line, line
    quiet = _replay(*args, "--progress-every", "0.001", "--quiet")
    assert quiet.returncode == 0 and "ETA" not in quiet.stderr
