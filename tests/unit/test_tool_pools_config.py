"""`[tool_pools.NAME]` in the config file: parsed into host URLs, or refused naming the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from daemon.config import ConfigError, load
from tools import DockerHosts
from tools.spec import parse_pools


def _load(tmp_path: Path, text: str) -> None:
    f = tmp_path / "agentd.toml"
    f.write_text(text)
    load(config_file=str(f), env={})


def test_pools_parse_and_a_tool_names_one(tmp_path: Path) -> None:
    _load(tmp_path, '[tool_pools.cpu]\nhosts = ["unix:///a.sock", "tcp://10.0.0.2:2375"]\n'
                    '[tools.box]\nimage = "i"\npool = "cpu"\n')
    assert parse_pools({"cpu": {"hosts": ["unix:///a.sock", "tcp://h:2375"]}}) == {
        "cpu": ("unix:///a.sock", "tcp://h:2375")}


@pytest.mark.parametrize(("text", "needle"), [
    ('[tool_pools.cpu]\nhosts = []\n', "config tool_pools: cpu: "),
    ('[tool_pools.cpu]\nhosts = ["http://h"]\n', "hosts[0] must be a Docker engine URL"),
    ('[tool_pools.cpu]\nhosts = ["unix:///a", "unix:///a"]\n', "names an engine twice"),
    ('[tool_pools.cpu]\nhost = ["unix:///a"]\n', "unknown field `host`"),
    ('tool_pools = 3\n', "config key 'tool_pools': expected dict"),
    ('[tool_pools]\ncpu = 3\n', "config tool_pools: cpu: Expected `object`"),
    ('[tools.box]\nimage = "i"\npool = "gpu"\n', "config tools.box: pool 'gpu' is not one of"),
    ('[tools.box]\nbackend = "process"\npool = "cpu"\n',
     "pool is not supported by the process backend"),
])
def test_bad_pools_are_refused_naming_the_key(tmp_path: Path, text: str, needle: str) -> None:
    with pytest.raises(ConfigError) as caught:
        _load(tmp_path, text)
    assert needle in str(caught.value)


def test_without_a_default_pool_docker_tools_use_docker_host(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DOCKER_HOST", "unix:///run/x.sock")
    assert DockerHosts({"cpu": ["tcp://h:2375"]}).pools == {
        "cpu": ["tcp://h:2375"], "default": ["unix:///run/x.sock"]}
    assert DockerHosts({"default": ["tcp://h:2375"]}).pools == {"default": ["tcp://h:2375"]}
