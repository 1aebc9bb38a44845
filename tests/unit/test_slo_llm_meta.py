"""The meta-llm policy: it decides on the last answer the daemon handed over, or on the
rule map, and says which; its config keys."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest

from daemon import config
from daemon.policies.slo_layers import startup_policy
from daemon.slo.settings import parse_settings
from daemon.slo.tables import DEFAULT_LLM
from scheduling.layers import META_POLICIES
from scheduling.slo.meta import Decision, RuleThresholds, parse_llm_decision
from scheduling.slo.meta_llm import REASON_MAX_CHARS, LlmMeta
from scheduling.slo.ordering import default_registry
from scheduling.slo.views import LongView

CALM = LongView(
    window_s=60.0, completions=50, arrival_rate=2.0, prev_arrival_rate=2.0,
    prompt_len_mean=200.0, output_len_mean=100.0, output_len_cv=0.3, violation_rate=0.0,
    ttft_violation_rate=0.0, tpot_violation_rate=0.0, violation_trend=0.0, ttft_p99_s=0.5,
    fairness=1.0, tenant_attainment={"a": 1.0}, goodput=2.0, esg_ratio=1.0)
UNFAIR = dataclasses.replace(CALM, fairness=0.5, tenant_attainment={"a": 1.0, "b": 0.2})


def meta() -> LlmMeta:
    return LlmMeta(RuleThresholds(min_completions=10), initial="fcfs")


def test_before_its_first_decision_there_is_nothing_to_ask() -> None:
    m = meta()
    assert (m.prompt(), m.outcome) == (None, None)
    decision = m.choose(UNFAIR, 0.0)
    assert decision.policy_name == "wfq"  # the rule map's answer to unfair tenants
    outcome = m.outcome
    assert outcome is not None and (outcome.kind, outcome.detail) == ("pending", "no reply")
    prompt = m.prompt()
    assert prompt is not None and '"fairness": 0.5' in prompt and "wfq" in prompt


def test_a_valid_answer_decides_once() -> None:
    m = meta()
    m.choose(CALM, 0.0)
    m.on_response(json.dumps({"policy": "edf", "reason": "deadlines are close"}))
    assert m.choose(CALM, 1.0) == Decision("edf", "LLM: deadlines are close")
    assert m.outcome.kind == "accepted"  # type: ignore[union-attr]
    assert m.choose(CALM, 2.0).policy_name == "fcfs"  # used once: the rules keep fcfs
    assert m.outcome.kind == "pending"  # type: ignore[union-attr]


@pytest.mark.parametrize(("kind", "detail"), [
    ("timeout", "no answer within 1.60s"), ("no_worker", "no healthy worker serves any model"),
    ("error", "worker local-sim-0 lost")])
def test_a_failed_call_falls_back_to_the_rules_and_says_why(kind: str, detail: str) -> None:
    m = meta()
    m.on_failure(kind, detail)
    decision = m.choose(UNFAIR, 0.0)
    assert decision.policy_name == "wfq"
    assert decision.reason.startswith(f"no LLM decision ({kind}: {detail}); rules: unfair")
    assert (m.outcome.kind, m.outcome.detail, m.outcome.decision) == (  # type: ignore[union-attr]
        kind, detail, decision)


def test_an_invalid_answer_is_rejected_with_its_reason() -> None:
    m = meta()
    m.on_response("I would pick EDF.")
    assert m.choose(UNFAIR, 0.0).reason.startswith(
        "LLM output rejected (malformed JSON (JSONDecodeError)); rules: unfair")
    assert m.outcome.kind == "invalid"  # type: ignore[union-attr]


def test_the_schema_allows_exactly_the_replies_that_parse() -> None:
    m = meta()
    schema = m.schema()
    pool = default_registry().names()
    assert schema["properties"]["policy"]["enum"] == list(pool)
    assert schema["required"] == ["policy", "reason"] and not schema["additionalProperties"]
    longest = json.dumps({"policy": max(pool, key=len), "reason": "x" * REASON_MAX_CHARS})
    assert isinstance(parse_llm_decision(longest, pool), Decision)
    # a model looping inside the reason still closes the JSON before max_tokens cuts it
    assert len(longest) <= DEFAULT_LLM.max_tokens


def test_meta_llm_is_a_built_in_and_llm_its_short_name() -> None:
    assert META_POLICIES["meta-llm"] is LlmMeta
    for name in ("meta-llm", "llm"):
        cfg = config.load(env={"AGENTD_META_POLICY": name})
        assert startup_policy(cfg, "meta") == "meta-llm"
        assert startup_policy(cfg, "ordering") == "fcfs"


def test_meta_llm_is_listed_without_the_daemon_settings() -> None:
    """META_POLICIES lists meta-llm on its own: nothing outside scheduling/ has to run
    first (a fresh interpreter, so no earlier import can have added it)."""
    code = ("import sys, scheduling.layers as lp; "
            "assert 'daemon.slo.settings' not in sys.modules; "
            "print(lp.META_POLICIES['meta-llm'].__name__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=60)
    assert out.stdout.strip() == "LlmMeta"


def test_the_llm_table() -> None:
    s = parse_settings({"llm": {"model": "SmolLM2", "timeout_s": 3, "max_tokens": 48}})
    assert (s.llm.model, s.llm.timeout_s, s.llm.max_tokens) == ("SmolLM2", 3.0, 48)
    assert parse_settings({}).llm.timeout_s == 0.0  # 80% of the meta interval
    for raw, key in (({"max_tokens": 0}, "slo.llm.max_tokens"),
                     ({"timeout_s": -1}, "slo.llm.timeout_s"),
                     ({"model": 3}, "slo.llm.model"), ({"temperature": 1}, "slo.llm.temperature")):
        with pytest.raises(ValueError, match=f"'{key}'"):
            parse_settings({"llm": raw})
