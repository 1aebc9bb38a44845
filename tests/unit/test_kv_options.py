"""[kv_options]: the agentd KV policy's options from the daemon's config."""

from __future__ import annotations

from pathlib import Path

import pytest

from daemon import config as config_mod
from daemon.config import ConfigError
from daemon.policies.layers import KV_LAYER
from scheduling.kv import AgentdPolicy, make_kv_policy


def test_a_config_file_tunes_the_agentd_policy(tmp_path: Path) -> None:
    path = tmp_path / "agentd.toml"
    path.write_text("[kv_options]\nfair_resume = false\nhold_s = 5\nadmits_per_tick = 2\n")
    cfg = config_mod.load(config_file=str(path), env={})
    policy = make_kv_policy(cfg.kv_policy, cfg.kv_options)
    assert isinstance(policy, AgentdPolicy)
    assert (policy.options.fair_resume, policy.options.hold_s,
            policy.options.admits_per_tick) == (False, 5.0, 2)


def test_the_policy_registry_builds_the_builtin_with_the_same_options() -> None:
    """A restart installs the stored built-in through the registry: it keeps the tuning."""

    class Core:
        config = config_mod.load(flags={"kv_options": {"hold_s": 7.5}}, env={})

    built = KV_LAYER.builtin("agentd", Core())
    assert isinstance(built, AgentdPolicy) and built.options.hold_s == 7.5
    assert not isinstance(KV_LAYER.builtin("sticky", Core()), AgentdPolicy)


@pytest.mark.parametrize(("table", "named"), [
    ({"nope": True}, "kv_options.nope"),
    ({"hold_s": True}, "kv_options.hold_s"),
    ({"admits_per_tick": 1.5}, "kv_options.admits_per_tick"),
    ({"fair_resume": 1}, "kv_options.fair_resume"),
])
def test_a_wrong_option_is_refused_naming_it(table: dict[str, object], named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        config_mod.load(flags={"kv_options": table}, env={})


def test_options_for_another_policy_are_refused() -> None:
    with pytest.raises(ConfigError, match="kv_options"):
        config_mod.load(flags={"kv_policy": "sticky", "kv_options": {"hold_s": 1.0}}, env={})
