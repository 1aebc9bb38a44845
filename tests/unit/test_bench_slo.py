"""bench.slo's protocol: a report run and a tuning run cut their scenarios from different
halves of the traces, and only a report run judges the targets."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from bench import slo
from daemon.replay.workload import ProgramSpec, StepSpec


@pytest.fixture
def synthetic_traces(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    step = (StepSpec(10, 1, 10),)
    rows = tuple(ProgramSpec(f"r{i}", i * 0.25, step) for i in range(40_000))
    monkeypatch.setattr(slo, "whole_trace", lambda name: rows)
    slo.trace.cache_clear()
    slo.specs_for.cache_clear()
    yield
    slo.trace.cache_clear()
    slo.specs_for.cache_clear()


@pytest.mark.usefixtures("synthetic_traces")
def test_tuning_and_report_scenarios_come_from_different_halves() -> None:
    for scenario in ("code", "conv"):
        dev = {s.program_id for s in slo.sweep(scenario, 2.0, "dev")}
        report = {s.program_id for s in slo.sweep(scenario, 2.0, "report")}
        assert dev and report and not dev & report
    for name, cut in slo.SLICES.items():
        dev_ids = {s.program_id for s in cut("dev")}
        assert dev_ids and not dev_ids & {s.program_id for s in cut("report")}, name
    assert {sc.part for sc in slo.scenarios(True, "dev")} == {"dev"}
    assert {sc.part for sc in slo.scenarios(False)} == {"report"}


def test_a_tuning_run_prints_no_verdict(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    rows = [{"scenario": "conv-x30", "ordering": o, "goodput_rps": 1.0, "esg": 1.0,
             "esg_ratio": 0.5, "slo_attainment": 1.0, "ttft_s": {"p99": 1.0},
             "policy_switches": 0, "rollbacks": 0, "requests": 1, "wall_s": 0.1}
            for o in ("fcfs", "full")]
    monkeypatch.setattr(slo, "_run_all", lambda tasks, jobs, clock: rows)
    monkeypatch.setattr(slo, "save", lambda name, params, rows: tmp_path / f"{name}.json")
    monkeypatch.setattr(slo, "plot_slo", lambda rows, path: None)
    assert slo.main(["--tune", "--quick"]) == 0
    assert "target" not in capsys.readouterr().err
    assert slo.main(["--quick"]) == 0
    assert "target 2.0" in capsys.readouterr().err
