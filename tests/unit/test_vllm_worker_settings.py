"""The vLLM settings that reach a worker's command line, and the CLIs that set them up."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from daemon import config
from daemon.commands.calibrate import EngineSettings, add_calibrate_parser, settings_from_args
from daemon.models.smollm2 import MARKER, REQUIRED_FILES
from daemon.workers.supervisor import worker_command

ROOT = Path(__file__).resolve().parents[2]


def _vllm_cmd(env: dict[str, str]) -> list[str]:
    cfg = config.load(env={"AGENTD_ENGINE": "vllm", **env})
    return worker_command(cfg, "ipc:///tmp/x", "w0")


def test_vllm_workers_run_eagerly_by_default() -> None:
    assert "--no-enforce-eager" not in _vllm_cmd({})


def test_cuda_graphs_setting_reaches_the_worker_command() -> None:
    cmd = _vllm_cmd({"AGENTD_VLLM_CUDA_GRAPHS": "1", "AGENTD_VLLM_DTYPE": "bfloat16"})
    assert "--no-enforce-eager" in cmd
    assert cmd[cmd.index("--dtype") + 1] == "bfloat16"


def test_calibrate_flags_reach_the_engine_settings(tmp_path: Path) -> None:
    import argparse

    parser = argparse.ArgumentParser()
    add_calibrate_parser(parser.add_subparsers(dest="command"))
    graphed = settings_from_args(parser.parse_args(
        ["calibrate", "--model", str(tmp_path), "--dtype", "bfloat16", "--cuda-graphs",
         "--load-format", "dummy"]))
    assert graphed == EngineSettings(str(tmp_path), kv_cache_bytes=1 << 30, dtype="bfloat16",
                                     cuda_graphs=True, load_format="dummy")
    eager = settings_from_args(parser.parse_args(["calibrate", "--model", str(tmp_path)]))
    assert not eager.cuda_graphs
    assert eager.load_format == "auto"


def _fetch(cache_home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "XDG_CACHE_HOME": str(cache_home)}
    argv = [sys.executable, "-m", "daemon.commands.cli", "model", "fetch-smollm2", *args]
    return subprocess.run(argv,
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)


def test_fetch_without_a_directory_uses_the_default_one(tmp_path: Path) -> None:
    # A finished conversion in the default place: nothing is downloaded, its path is printed.
    model_dir = tmp_path / "agentd" / "models" / "SmolLM2-135M-Instruct"
    model_dir.mkdir(parents=True)
    for name in (*REQUIRED_FILES, MARKER):
        (model_dir / name).write_text(json.dumps({}))
    done = _fetch(tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(model_dir)


def test_fetch_into_a_half_written_default_directory_is_one_readable_line(
    tmp_path: Path,
) -> None:
    model_dir = tmp_path / "agentd" / "models" / "SmolLM2-135M-Instruct"
    model_dir.mkdir(parents=True)
    (model_dir / "config.json").write_text("{}")
    failed = _fetch(tmp_path)
    assert failed.returncode == 1
    assert failed.stderr.count("\n") == 1
    assert "is not a finished conversion" in failed.stderr
    assert "Traceback" not in failed.stderr


def test_kv_offload_reaches_the_worker_command_and_the_cpu_build_refuses_it() -> None:
    assert "--kv-offload-bytes" not in _vllm_cmd({})
    cmd = _vllm_cmd({"AGENTD_VLLM_KV_OFFLOAD_BYTES": str(8 << 30)})
    assert cmd[cmd.index("--kv-offload-bytes") + 1] == str(8 << 30)
    import importlib.util

    import pytest

    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vLLM is not installed")
    from daemon.engines.vllm.engine import VllmEngine, on_cpu_build

    if not on_cpu_build():
        pytest.skip("a GPU build: offloading is allowed there")
    with pytest.raises(ValueError, match="needs a GPU build"):
        VllmEngine("/nonexistent", kv_offload_bytes=1 << 30)
