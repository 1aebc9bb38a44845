"""The [placement] table: the backend it picks, and every wrong value refused by name."""

from __future__ import annotations

from pathlib import Path

import pytest

from daemon.config import ConfigError, load
from daemon.workers import placement
from daemon.workers.placement_settings import PlacementSettings, parse, ray_address, worker_connect
from daemon.workers.supervisor import Supervisor


def config(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "agentd.toml"
    path.write_text(text)
    return path


def loaded(tmp_path: Path, text: str):  # type: ignore[no-untyped-def]
    return load(config_file=str(config(tmp_path, text)), env={})


def test_without_a_table_the_workers_are_local_processes(tmp_path: Path) -> None:
    cfg = loaded(tmp_path, "workers = 2\n")
    assert isinstance(placement.make(cfg, cfg.broker_endpoint, "k", print), Supervisor)


def test_ray_settings_are_read(tmp_path: Path) -> None:
    cfg = loaded(tmp_path, """worker_bind = "tcp://10.0.0.5:7000"
[placement]
backend = "ray"
address = "ray://head:10001"
num_cpus = 2
num_gpus = 1
resources = { "gpu-node" = 1 }
max_restarts = 5
spread = false
""")
    settings = parse(cfg.placement)
    assert settings == PlacementSettings(backend="ray", address="ray://head:10001", num_cpus=2,
                                         num_gpus=1, resources={"gpu-node": 1},
                                         max_restarts=5, spread=False)


@pytest.mark.parametrize(("text", "named"), [
    ('[placement]\nbackend = "slurm"\n', "$.backend"),
    ('[placement]\nnum_cpus = -1\n', "$.num_cpus"),
    ('[placement]\nnum_gpus = "two"\n', "$.num_gpus"),
    ('[placement]\nmax_restarts = -2\n', "$.max_restarts"),
    ('[placement]\nresources = { gpu = -1 }\n', "$.resources"),
    ('[placement]\nreplicas = 3\n', "replicas"),
])
def test_a_wrong_value_is_refused_naming_its_key(tmp_path: Path, text: str, named: str) -> None:
    with pytest.raises(ConfigError, match="config placement") as err:
        loaded(tmp_path, text)
    assert named in str(err.value)


def test_ray_needs_a_tcp_endpoint_the_nodes_reach(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="worker_bind"):
        loaded(tmp_path, '[placement]\nbackend = "ray"\n')  # the default ipc socket
    with pytest.raises(ConfigError, match=r"placement\.connect"):
        loaded(tmp_path, 'worker_bind = "tcp://0.0.0.0:7000"\n[placement]\nbackend = "ray"\n')
    cfg = loaded(tmp_path, 'worker_bind = "tcp://0.0.0.0:7000"\n[placement]\nbackend = "ray"\n'
                           'connect = "tcp://daemon.internal:7000"\n')
    assert worker_connect(cfg, parse(cfg.placement)) == (
        "tcp://daemon.internal:7000")


def test_the_cluster_address_comes_from_config_then_ray_address() -> None:
    assert ray_address(PlacementSettings(address="10.0.0.1:6379"),
                       {"RAY_ADDRESS": "other:6379"}) == "10.0.0.1:6379"
    assert ray_address(PlacementSettings(), {"RAY_ADDRESS": "other:6379"}) == "other:6379"
    assert ray_address(PlacementSettings(), {}) == "auto"


def test_tensor_parallel_ranks_are_vllm_gpus(tmp_path: Path) -> None:
    ray = 'worker_bind = "tcp://10.0.0.5:7000"\n'
    with pytest.raises(ConfigError, match="tensor_parallel_size > 1 needs engine"):
        loaded(tmp_path, ray + '[placement]\nbackend = "ray"\ntensor_parallel_size = 2\n'
                               'num_gpus = 1\n')  # engine sim
    with pytest.raises(ConfigError, match="num_gpus > 0"):
        loaded(tmp_path, ray + 'engine = "vllm"\n[placement]\nbackend = "ray"\n'
                               'tensor_parallel_size = 2\n')
    with pytest.raises(ConfigError, match=r"\$\.tensor_parallel_size"):
        loaded(tmp_path, ray + '[placement]\ntensor_parallel_size = 0\n')
    cfg = loaded(tmp_path, ray + 'engine = "vllm"\n[placement]\nbackend = "ray"\n'
                                 'tensor_parallel_size = 4\nnum_gpus = 1\n')
    assert parse(cfg.placement).tensor_parallel_size == 4
