"""The SLO stack's config keys: the [slo] tables, the startup policies, one-line errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from daemon import config
from daemon.policies.slo_layers import startup_policy
from daemon.slo.settings import parse_settings


def test_tables_tune_the_rule_map_and_the_guards() -> None:
    s = parse_settings({"cycle_s": 0.25, "rules": {"min_completions": 5,
                                                   "anomaly_violation": 0.9},
                        "guard": {"bypass_violation": 1.01}})
    assert s.cycle_s == 0.25 and s.long_window_s == 60.0
    assert (s.rules.min_completions, s.rules.anomaly_violation) == (5, 0.9)
    assert s.guard.bypass_violation == 1.01 and s.guard.rho == 1.5


@pytest.mark.parametrize(("raw", "key"), [
    ({"cycle": 1}, "slo.cycle"),
    ({"cycle_s": 0}, "slo.cycle_s"),
    ({"cycle_s": "fast"}, "slo.cycle_s"),
    ({"rules": {"min_completions": 2.5}}, "slo.rules.min_completions"),
    ({"rules": {"surge": 2}}, "slo.rules.surge"),
    ({"guard": 3}, "slo.guard"),
    ({"delta_frag": 1.5}, "slo.delta_frag"),
])
def test_bad_values_name_their_key(raw: dict, key: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(ValueError, match=f"'{key}'"):
        parse_settings(raw)


def test_config_file_and_startup_policies(tmp_path: Path) -> None:
    path = tmp_path / "agentd.toml"
    path.write_text('meta_policy = "edf"\n[slo.rules]\nmin_completions = 3\n')
    cfg = config.load(config_file=str(path), env={})
    assert cfg.slo == {"rules": {"min_completions": 3}}
    # A pool policy as the meta policy runs fixed: meta off, ordering that policy.
    assert [startup_policy(cfg, layer) for layer in ("ordering", "meta", "admission")] == [
        "edf", "meta-off", "statera"]
    defaults = config.load(env={})
    assert [startup_policy(defaults, layer) for layer in ("ordering", "meta", "admission")] == [
        "fcfs", "meta-rules", "statera"]


@pytest.mark.parametrize(("env", "key"), [
    ({"AGENTD_META_POLICY": "oracle"}, "meta_policy"),
    ({"AGENTD_ORDERING_POLICY": "lifo"}, "ordering_policy"),
    ({"AGENTD_ADMISSION_POLICY": "none"}, "admission_policy"),
    ({"AGENTD_META_INTERVAL_S": "0"}, "meta_interval_s"),
])
def test_bad_policy_keys_fail_the_config_load(env: dict[str, str], key: str) -> None:
    with pytest.raises(config.ConfigError, match=key):
        config.load(env=env)
