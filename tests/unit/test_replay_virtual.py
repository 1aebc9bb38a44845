"""`agentd replay` is the daemon's own core on a virtual clock (daemon/replay/virtual.py)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from daemon import config as config_mod
from daemon.replay import Hardware, Workload, replay, replay_main, synthetic_programs
from daemon.replay.workload import ProgramSpec, StepSpec

FAST = Hardware(workers=2, kv_tokens=444_000, cost_model="llama3-8b-h100", max_num_seqs=256,
                max_batched_tokens=8192)


def agents(n: int, steps: int = 3, prompt: int = 2000, tool_s: float = 1.0) -> list[ProgramSpec]:
    """`n` agents arriving 0.5 s apart, each `steps` LLM calls on a growing context."""
    return [ProgramSpec(f"p{i}", i * 0.5, tuple(
        StepSpec(prompt + 500 * k, 100, prompt if k == 0 else 500, 0.0 if k == 0 else tool_s)
        for k in range(steps))) for i in range(n)]


def run(specs: list[ProgramSpec], hardware: Hardware = FAST, workload: Workload | None = None,
        **config: Any) -> dict[str, Any]:
    cfg = config_mod.load(flags=config, env={})
    return replay(specs, cfg, hardware, workload or Workload())


def test_every_program_runs_through_the_daemon_and_stops() -> None:
    specs = agents(6)
    row = run(specs)
    assert row["completed_programs"] == 6
    assert row["completed_steps"] == sum(len(s.steps) for s in specs)
    assert row["unserved_requests"] == 0
    assert row["simulated"] is True
    # Later steps extend the context the sim produced: the prefix cache hits.
    assert row["prefix_hit_rate"] > 0.5


def test_a_run_repeats_exactly() -> None:
    specs = synthetic_programs(12, seed=3)
    first, second = run(specs), run(specs)
    for row in (first, second):
        row.pop("wall_s")
    assert first == second


def test_a_duration_cuts_the_run_and_counts_what_was_left() -> None:
    row = run(agents(10, steps=4, tool_s=5.0), workload=Workload(duration_s=3.0))
    assert row["elapsed_s"] == 3.0
    assert row["completed_programs"] < 10


def test_tight_kv_makes_the_daemons_kv_loop_pause_programs() -> None:
    specs = agents(24, steps=4, prompt=3000, tool_s=3.0)
    tight = Hardware(workers=2, kv_tokens=24_000, cost_model="llama3-8b-h100",
                     max_num_seqs=256, max_batched_tokens=8192)
    assert run(specs, tight, kv_policy="agentd")["paused_share"] > 0
    assert run(specs, tight, kv_policy="vllm-default")["paused_share"] == 0


def test_the_config_files_meta_interval_changes_the_replays_switches(tmp_path: Path) -> None:
    """The same key, read from the same file as `agentd start --config`, means the same."""
    rows = []
    for interval in (1.0, 10_000.0):
        path = tmp_path / f"agentd-{interval}.toml"
        path.write_text(f"meta_interval_s = {interval}\n")
        out = tmp_path / f"out-{interval}.json"
        assert replay_main(["--synthetic-agents", "24", "--seed", "2", "--quiet", "--config",
                            str(path), "--workers", "2", "--kv-tokens", "444000",
                            "--cost-model", "llama3-8b-h100", "--max-batch", "256",
                            "--max-batched-tokens", "8192", "--json", str(out)]) == 0
        rows.append(json.loads(out.read_text())["results"][0])
    often, never = rows
    assert often["policy_switches"] > 0
    assert never["policy_switches"] == 0


def test_a_store_keeps_the_daemons_own_trace_in_virtual_time(tmp_path: Path) -> None:
    store = tmp_path / "replay.db"
    out = tmp_path / "out.json"
    assert replay_main(["--synthetic-agents", "4", "--quiet", "--workers", "2",
                        "--cost-model", "llama3-8b-h100", "--store", str(store),
                        "--json", str(out)]) == 0
    row = json.loads(out.read_text())["results"][0]
    with sqlite3.connect(store) as db:
        kinds = {k for (k,) in db.execute("SELECT DISTINCT kind FROM trace_events")}
        (last,) = db.execute("SELECT max(ts) FROM trace_events").fetchone()
        (programs,) = db.execute("SELECT count(*) FROM programs WHERE status = 'STOPPED'"
                                 ).fetchone()
    assert {"request.dispatched", "request.finished", "program.status",
            "worker.registered"} <= kinds
    assert last <= row["elapsed_s"] + 1.0  # virtual seconds, not the wall clock's epoch
    assert programs == 4


def test_policies_and_orderings_run_side_by_side(tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    assert replay_main(["--synthetic-agents", "4", "--quiet", "--policy", "agentd,sticky",
                        "--ordering", "fcfs,full", "--cost-model", "llama3-8b-h100",
                        "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["results"]
    assert [(r["policy"], r["ordering"]) for r in rows] == [
        ("agentd", "fcfs"), ("agentd", "meta-rules"), ("sticky", "fcfs"),
        ("sticky", "meta-rules")]


@pytest.mark.parametrize(("argv", "names"), [
    (["--synthetic-agents", "2", "--policy", "nope"], "--policy"),
    (["--synthetic-agents", "2", "--ordering", "nope"], "--ordering"),
    (["--synthetic-agents", "2", "--policy", "agentd,sticky", "--store", "x.db"], "--store"),
    (["--synthetic-agents", "2", "--load", "0"], "--load"),
    ([], "TRACE_FILE"),
    (["--synthetic-agents", "2", "--store", __file__], "--store"),
])
def test_bad_flags_exit_2_with_one_line(argv: list[str], names: str,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    assert replay_main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("agentd replay: ") and names in err[0]


def test_a_bad_config_value_exits_2_naming_the_key(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "agentd.toml"
    path.write_text("meta_interval_s = -1\n")
    assert replay_main(["--synthetic-agents", "2", "--config", str(path)]) == 2
    assert "meta_interval_s" in capsys.readouterr().err
