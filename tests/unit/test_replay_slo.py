"""``agentd replay --ordering`` on a tiny Azure-format slice, and the SLO layer's local
controller (dispatch gate, token budget) on small synthetic bursts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from daemon.replay import Replay, ReplayConfig, replay_main, slo_stack
from daemon.replay.slo import GATE_STEPS, ORDERINGS, SloLayer
from daemon.replay.workload import ProgramSpec, StepSpec
from scheduling.kv import make_kv_policy

ROW_FIELDS = {"ordering", "goodput_rps", "esg", "slo_attainment", "ttft_compliance",
              "tpot_compliance", "ttft_s", "policy_switches", "rollbacks"}


def azure_csv(path: Path, rows: int = 60, every_s: float = 0.25) -> Path:
    """An Azure-format trace: alternating short and long prompts, short and long outputs."""
    lines = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    for i in range(rows):
        ms = round(i * every_s * 1000)
        prompt, out = (3000, 20) if i % 3 == 0 else (400, 120)
        lines.append(f"2023-11-16 18:{ms // 60000:02d}:{ms % 60000 / 1000:09.6f},{prompt},{out}")
    path.write_text("\n".join(lines))
    return path


def replay_json(tmp_path: Path, *args: str) -> dict[str, object]:
    out = tmp_path / "out.json"
    trace = azure_csv(tmp_path / "azure_conv.csv")
    rc = replay_main([str(trace), "--format", "azure", "--workers", "1", "--quiet",
                      "--policy", "vllm-default", "--json", str(out), *args])
    assert rc == 0
    return json.loads(out.read_text())  # type: ignore[no-any-return]


def template(tmp_path: Path, ttft_s: float, tpot_s: float) -> str:
    path = tmp_path / f"slo-{ttft_s}-{tpot_s}.json"
    path.write_text(json.dumps({"dialogue": {"ttft_s": ttft_s, "tpot_s": tpot_s}}))
    return str(path)


def test_orderings_run_side_by_side_with_the_slo_fields(tmp_path: Path) -> None:
    data = replay_json(tmp_path, "--ordering", "fcfs,two_lane,meta-bandit,full", "--load", "2")
    rows = data["results"]
    assert isinstance(rows, list)
    assert [r["ordering"] for r in rows] == ["fcfs", "two_lane", "meta-bandit", "full"]
    for row in rows:
        assert set(row) >= ROW_FIELDS and row["completed_steps"] == 60
        assert set(row["ttft_s"]) == {"p50", "p95", "p99"}
        assert row["ttft_s"]["p50"] <= row["ttft_s"]["p95"] <= row["ttft_s"]["p99"]
        for key in ("slo_attainment", "ttft_compliance", "tpot_compliance"):
            assert 0.0 <= row[key] <= 1.0
        assert row["slo_attainment"] <= min(row["ttft_compliance"], row["tpot_compliance"])
        assert row["goodput_rps"] * row["elapsed_s"] == pytest.approx(
            row["slo_attainment"] * 60, abs=0.01)
        assert row["esg"] > 0 and row["policy_switches"] >= row["rollbacks"] >= 0
    assert data["params"]["load"] == 2.0  # type: ignore[index]


def test_load_compresses_arrivals(tmp_path: Path) -> None:
    slow = replay_json(tmp_path, "--ordering", "fcfs")["results"][0]  # type: ignore[index]
    fast = replay_json(tmp_path, "--ordering", "fcfs", "--load", "4")["results"][0]  # type: ignore[index]
    # The trace spans 14.75 s of arrivals; at 4x they span a quarter of that.
    assert slow["elapsed_s"] > 14.75 > fast["elapsed_s"]


def test_slo_template_sets_the_targets(tmp_path: Path) -> None:
    lax = replay_json(tmp_path, "--ordering", "fcfs", "--slo-template",
                      template(tmp_path, 60.0, 1.0))["results"][0]  # type: ignore[index]
    strict = replay_json(tmp_path, "--ordering", "fcfs", "--slo-template",
                         template(tmp_path, 0.001, 1.0))["results"][0]  # type: ignore[index]
    assert lax["slo_attainment"] == 1.0
    assert strict["ttft_compliance"] == 0.0 and strict["goodput_rps"] == 0.0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--ordering", "fcfs,nope"], "--ordering: unknown ordering 'nope'"),
        (["--ordering", "fcfs", "--load", "0"], "--load must be positive"),
        (["--slo-template", "{tpl}"], "--slo-template needs --ordering"),
        (["--ordering", "fcfs", "--slo-template", "{bad}"], "dialogue.tpot_s must be a positive"),
    ],
)
def test_bad_slo_flags_exit_2_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"dialogue": {"ttft_s": 1.0, "tpot_s": -1}}))
    args = [a.format(tpl=template(tmp_path, 1.0, 0.1), bad=bad) for a in args]
    trace = azure_csv(tmp_path / "azure_conv.csv", rows=5)
    assert replay_main([str(trace), "--format", "azure", "--quiet", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and message in err


def test_every_stack_starts_on_a_policy_of_its_own_pool() -> None:
    for name in ORDERINGS:
        stack = slo_stack(name)
        assert stack.initial in stack.pool, name
    assert not {"two_lane", "two_lane_esg"} & set(slo_stack("full-no-two-lane").pool)
    # full's two-lane is the ESG-ordered late queue; full-fifo-late is its ablation. It
    # starts in esg_fast; full-lanes-first (starting in its two-lane) is that ablation.
    assert slo_stack("full").lanes == slo_stack("full-lanes-first").initial == "two_lane_esg"
    assert slo_stack("full").initial == "esg_fast"
    fifo = slo_stack("full-fifo-late")
    assert fifo.initial == fifo.lanes == "two_lane" and fifo.fence and fifo.adaptive
    assert slo_stack("full-no-meta").selector is None and slo_stack("full-no-meta").fence
    frozen = slo_stack("full-frozen-statera")
    assert frozen.fence and not frozen.adaptive


# --- the SLO layer's local controller -------------------------------------------------


def burst(n: int, prompt: int, output: int, every_s: float = 0.0) -> list[ProgramSpec]:
    return [ProgramSpec(f"r{i:03d}", i * every_s, (StepSpec(prompt, output, prompt),),
                        task="code_generation") for i in range(n)]


def test_gate_keeps_ordering_out_of_the_engines_fifo(monkeypatch: pytest.MonkeyPatch) -> None:
    """After every dispatch the engine holds at most GATE_STEPS steps of unprefilled
    prompt, so the policy, not the engine, decides the order of the rest."""
    seen: list[tuple[int, int]] = []
    original = SloLayer.pump

    def spy(layer: SloLayer, worker: str, now: float) -> list[str]:
        out = original(layer, worker, now)
        backlog = sum(r.prompt_tokens for r in layer.prefilling[worker].values())
        seen.append((backlog, len(layer.queues[worker])))
        return out

    cfg = ReplayConfig(workers=1, max_batched_tokens=2048)
    monkeypatch.setattr(SloLayer, "pump", spy)
    Replay(burst(40, 1500, 4), cfg, make_kv_policy("vllm-default"), slo_stack("sjf")).run()
    assert max(backlog for backlog, _ in seen) <= GATE_STEPS * 2048
    assert max(queued for _, queued in seen) > 30  # the rest waited under the policy


def test_full_stack_shrinks_the_token_budget_under_prefill_pressure() -> None:
    """Long prompts with short outputs arriving faster than they prefill: FCFS at the full
    8192-token budget stretches every step past the 90 ms TPOT SLO; the full stack's
    budget loop brings TPOT back, the frozen-Statera ablation cannot."""
    specs = burst(300, 3000, 12, every_s=0.04)  # 75k prompt tokens/s, about 1.5x capacity
    cfg = ReplayConfig(workers=1)
    rows = {name: Replay(specs, cfg, make_kv_policy("vllm-default"), slo_stack(name)).run()
            for name in ("fcfs", "full", "full-frozen-statera")}
    assert rows["fcfs"]["tpot_compliance"] < 0.2
    assert rows["full-frozen-statera"]["tpot_compliance"] < 0.2
    assert rows["full"]["tpot_compliance"] > 0.7
    assert rows["full"]["goodput_rps"] > 5 * rows["fcfs"]["goodput_rps"]

