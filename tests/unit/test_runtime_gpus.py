"""The GPUs a run's agents may reserve: counted from device nodes or nvidia-smi,
narrowed by CUDA_VISIBLE_DEVICES, configured by `runtime_gpus`; and the resource wait
setting, checked by the config."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from daemon.config import ConfigError, load
from daemon.runtime.gpus import cuda_visible, visible_gpus


def _dev(tmp_path: Path, *names: str) -> Path:
    dev = tmp_path / "dev"
    dev.mkdir()
    for name in names:
        (dev / name).touch()
    return dev


def test_device_nodes_are_counted_not_the_control_nodes(tmp_path: Path) -> None:
    dev = _dev(tmp_path, "nvidia0", "nvidia1", "nvidia2", "nvidiactl", "nvidia-uvm",
               "nvidia-modeset", "nvme0")
    assert visible_gpus({}, dev) == 3
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "2"}, dev) == 1
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": ""}, dev) == 0
    (tmp_path / "none").mkdir()
    assert visible_gpus({}, _dev(tmp_path / "none"), smi=str(tmp_path / "no-smi")) == 0


def test_nvidia_smi_is_asked_when_no_device_node_is_there(tmp_path: Path) -> None:
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\n[ \"$1\" = -L ] || exit 2\n"
                   "echo 'GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-aaaa)'\n"
                   "echo 'GPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-bbbb)'\n")
    smi.chmod(smi.stat().st_mode | stat.S_IEXEC)
    empty = _dev(tmp_path)
    assert visible_gpus({}, empty, smi=str(smi)) == 2
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "1"}, empty, smi=str(smi)) == 1
    broken = tmp_path / "broken-smi"
    broken.write_text("#!/bin/sh\nexit 9\n")
    broken.chmod(broken.stat().st_mode | stat.S_IEXEC)
    assert visible_gpus({}, empty, smi=str(broken)) == 0


@pytest.mark.parametrize(("listed", "seen"), [
    (None, 4), ("0,1", 2), ("3,1,0", 3), ("0,7,1", 1), ("-1", 0), ("1,-1,2", 1),
    ("GPU-aaaa,GPU-bbbb", 2), ("0,,1", 1), ("0,1,2,3,4,5", 4), ("x", 0)])
def test_cuda_visible_devices_is_read_as_cuda_reads_it(listed: str | None, seen: int) -> None:
    assert cuda_visible(4, listed) == seen


def test_no_gpu_means_none_whatever_is_listed() -> None:
    assert cuda_visible(0, "0,1") == 0


def test_runtime_settings_are_checked(tmp_path: Path) -> None:
    cfg = load(env={})
    assert cfg.runtime_gpus == -1 and cfg.runtime_resource_wait_s == 60
    cfg = load(env={"AGENTD_RUNTIME_GPUS": "2", "AGENTD_RUNTIME_RESOURCE_WAIT_S": "5"})
    assert (cfg.runtime_gpus, cfg.runtime_resource_wait_s) == (2, 5)
    with pytest.raises(ConfigError, match="runtime_gpus"):
        load(env={"AGENTD_RUNTIME_GPUS": "-2"})
    with pytest.raises(ConfigError, match="runtime_resource_wait_s"):
        load(env={"AGENTD_RUNTIME_RESOURCE_WAIT_S": "-1"})
    toml = tmp_path / "agentd.toml"
    toml.write_text("runtime_gpus = 0.5\n")
    assert load(config_file=str(toml), env={}).runtime_gpus == 0.5
