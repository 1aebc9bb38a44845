"""Configuration precedence and validation."""

from __future__ import annotations

from pathlib import Path

import pytest

from daemon.config import ConfigError, load


def test_flags_beat_env_beat_file(tmp_path: Path) -> None:
    f = tmp_path / "agentd.toml"
    f.write_text('port = 1111\nworkers = 3\nlog_format = "json"\n')
    env = {"AGENTD_PORT": "2222", "AGENTD_WORKERS": "4"}
    cfg = load({"port": 3333}, config_file=str(f), env=env)
    assert (cfg.port, cfg.workers, cfg.log_format) == (3333, 4, "json")


@pytest.mark.parametrize(("text", "needle"), [
    ('nonsense = 1\n', "unknown key(s): nonsense"),
    ('port = "many"\n', "config key 'port'"),
    ('engine = "tpu"\n', "engine must be"),
    ('[tools.bad]\nbackend = "nope"\n', "config tools.bad"),
    ('kv_force_resume_s = 0\n', "kv_force_resume_s must be > 0"),
])
def test_bad_config_names_the_key(tmp_path: Path, text: str, needle: str) -> None:
    f = tmp_path / "agentd.toml"
    f.write_text(text)
    with pytest.raises(ConfigError) as err:
        load({}, config_file=str(f), env={})
    assert needle in str(err.value)


def test_force_resume_bound_is_read_from_the_file(tmp_path: Path) -> None:
    f = tmp_path / "agentd.toml"
    f.write_text("kv_force_resume_s = 120\n")
    assert load({}, config_file=str(f), env={}).kv_force_resume_s == 120.0
