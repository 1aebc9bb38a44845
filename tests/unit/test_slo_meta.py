"""Meta controller: rule map, bandit, LLM selector, rollback and bypass guards, the loop."""

from __future__ import annotations

import dataclasses
import json
import random

import pytest

from scheduling.slo.meta import (
    BypassOff,
    BypassOn,
    ContextualBandit,
    Decision,
    GuardConfig,
    LlmSelector,
    MetaLoop,
    Rollback,
    RuleMap,
    RuleThresholds,
    Switch,
    parse_llm_decision,
)
from scheduling.slo.views import LongView, ShortView

POOL = ("fcfs", "edf", "sjf", "two_lane", "wfq")
HEALTHY_LONG = LongView(
    window_s=60.0,
    arrival_rate=10.0,
    prev_arrival_rate=10.0,
    completions=500,
    prompt_len_mean=200.0,
    output_len_mean=150.0,
    output_len_cv=0.4,
    violation_rate=0.01,
    ttft_violation_rate=0.01,
    tpot_violation_rate=0.0,
    violation_trend=0.0,
    ttft_p99_s=1.0,
    goodput=9.9,
    esg_ratio=0.99,
    tenant_attainment={"a": 0.99, "b": 0.99},
    fairness=1.0,
)
HEALTHY_SHORT = ShortView(
    worker=None,
    queue_len=10,
    kv_util=0.6,
    ttft_p50_s=0.3,
    ttft_p99_s=1.0,
    tpot_mean_s=0.03,
    tpot_p99_s=0.05,
    violation_rate=0.05,
    completions=50,
)


def long(**kw: object) -> LongView:
    return dataclasses.replace(HEALTHY_LONG, **kw)  # type: ignore[arg-type]


def short(**kw: object) -> ShortView:
    return dataclasses.replace(HEALTHY_SHORT, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("view", "policy"),
    [
        (HEALTHY_LONG, "sjf"),
        (long(completions=3, violation_rate=0.9), "sjf"),
        (long(arrival_rate=40.0), "fcfs"),
        (long(violation_rate=0.7, ttft_violation_rate=0.7), "fcfs"),
        (long(output_len_cv=1.6, ttft_violation_rate=0.25, violation_rate=0.3), "two_lane"),
        (long(output_len_cv=1.6, ttft_violation_rate=0.0), "sjf"),
        (long(fairness=0.7, violation_rate=0.2), "wfq"),
        (long(violation_rate=0.2, ttft_violation_rate=0.05), "edf"),
    ],
)
def test_rule_map(view: LongView, policy: str) -> None:
    assert RuleMap(initial="sjf").choose(view, 0.0).policy_name == policy


def test_overload_rule_picks_two_lane_and_edf_waits_for_ttft_misses() -> None:
    """With the overload and TTFT-share thresholds set: heavy TTFT violations without
    length variance mean overload (two-lane), and TPOT-driven misses do not mean EDF."""
    rules = RuleMap("sjf", RuleThresholds(overload_ttft_violation=0.3, deadline_ttft_share=0.5))
    overloaded = long(violation_rate=0.5, ttft_violation_rate=0.45)
    decision = rules.choose(overloaded, 0.0)
    assert decision.policy_name == "two_lane" and "overload" in decision.reason
    assert rules.choose(long(violation_rate=0.3, ttft_violation_rate=0.05), 0.0).policy_name \
        == "sjf"
    assert rules.choose(long(violation_rate=0.3, ttft_violation_rate=0.2), 0.0).policy_name \
        == "edf"
    # Off by default: the paper's map sends the same overload to EDF.
    assert RuleMap("sjf").choose(overloaded, 0.0).policy_name == "edf"


def test_rule_map_picks_the_two_lane_it_is_given() -> None:
    rules = RuleMap("sjf", RuleThresholds(overload_ttft_violation=0.3), lanes="two_lane_esg")
    assert rules.choose(long(violation_rate=0.5, ttft_violation_rate=0.45), 0.0).policy_name \
        == "two_lane_esg"
    hol = long(output_len_cv=1.6, ttft_violation_rate=0.25, violation_rate=0.3)
    assert rules.choose(hol, 0.0).policy_name == "two_lane_esg"


def test_rule_map_keeps_what_was_applied() -> None:
    rules = RuleMap(initial="sjf")
    rules.on_applied("edf")
    decision = rules.choose(HEALTHY_LONG, 0.0)
    assert decision.policy_name == "edf" and "keep" in decision.reason


def _run_bandit(
    bandit: ContextualBandit,
    means: dict[str, float],
    view: LongView,
    rounds: int,
    rng: random.Random,
) -> list[str]:
    picks: list[str] = []
    reward = 0.0
    for _ in range(rounds):
        arm = bandit.choose(dataclasses.replace(view, esg_ratio=reward), 0.0).policy_name
        picks.append(arm)
        reward = min(1.0, max(0.0, means[arm] + rng.uniform(-0.1, 0.1)))
    return picks


def test_bandit_converges_on_a_stationary_reward() -> None:
    means = {"fcfs": 0.3, "edf": 0.5, "sjf": 0.75, "two_lane": 0.45, "wfq": 0.4}
    picks = _run_bandit(ContextualBandit(POOL), means, HEALTHY_LONG, 600, random.Random(3))
    assert picks[:5] == list(POOL)  # each arm tried once first
    assert picks[-100:].count("sjf") >= 85


def test_bandit_learns_each_context_separately() -> None:
    bandit = ContextualBandit(POOL)
    rng = random.Random(5)
    calm = {"fcfs": 0.3, "edf": 0.4, "sjf": 0.8, "two_lane": 0.3, "wfq": 0.3}
    hol = {"fcfs": 0.2, "edf": 0.3, "sjf": 0.3, "two_lane": 0.8, "wfq": 0.3}
    hol_view = long(violation_rate=0.3, output_len_cv=2.0)
    for _ in range(3):
        _run_bandit(bandit, calm, HEALTHY_LONG, 150, rng)
        _run_bandit(bandit, hol, hol_view, 150, rng)
    assert _run_bandit(bandit, calm, HEALTHY_LONG, 50, rng)[-30:].count("sjf") >= 25
    assert _run_bandit(bandit, hol, hol_view, 50, rng)[-30:].count("two_lane") >= 25
    with pytest.raises(ValueError):
        ContextualBandit(POOL, reward="vibes")


def test_llm_selector_accepts_a_valid_reply() -> None:
    sel = LlmSelector(POOL, RuleMap("sjf"))
    sel.on_response(json.dumps({"policy": "two_lane", "reason": "long requests block short ones"}))
    decision = sel.choose(HEALTHY_LONG, 0.0)
    assert decision == Decision("two_lane", "LLM: long requests block short ones")
    # A reply is used once; without a new one the rule map decides.
    assert "no reply" in sel.choose(HEALTHY_LONG, 1.0).reason


@pytest.mark.parametrize(
    "reply",
    [
        "EDF please",
        '```json\n{"policy": "edf", "reason": "x"}\n```',
        '["edf"]',
        '{"policy": "edf"}',
        '{"policy": "edf", "reason": "x", "bypass": true}',
        '{"policy": "lottery", "reason": "x"}',
        '{"policy": 3, "reason": "x"}',
        '{"policy": "edf", "reason": "   "}',
        "",
    ],
)
def test_llm_selector_falls_back_to_rules_on_invalid_output(reply: str) -> None:
    assert isinstance(parse_llm_decision(reply, POOL), str)
    sel = LlmSelector(POOL, RuleMap("sjf"))
    sel.on_response(reply)
    decision = sel.choose(long(fairness=0.6), 0.0)
    assert decision.policy_name == "wfq"
    assert decision.reason.startswith("LLM output rejected")


def test_llm_prompt_names_the_pool_and_the_schema() -> None:
    prompt = LlmSelector(POOL, RuleMap("edf")).build_prompt(HEALTHY_LONG)
    assert "Current policy: edf" in prompt and "two_lane" in prompt and '"policy"' in prompt
    view_json = prompt.split("seconds): ", 1)[1].split("\n", 1)[0]
    assert json.loads(view_json)["arrival_rate"] == 10.0


class Scripted:
    """A selector that answers from a list and records what the loop applied."""

    def __init__(self, *policies: str) -> None:
        self.policies = list(policies)
        self.calls = 0
        self.applied: list[str] = []

    def choose(self, view: LongView, now: float) -> Decision:
        self.calls += 1
        return Decision(self.policies.pop(0), "scripted")

    def on_applied(self, policy_name: str) -> None:
        self.applied.append(policy_name)


def test_loop_consults_the_selector_once_per_interval() -> None:
    sel = Scripted("edf", "edf", "wfq")
    loop = MetaLoop(sel, POOL, initial="sjf", interval_s=30.0)
    assert loop.tick(HEALTHY_SHORT, HEALTHY_LONG, 0.0) == [Switch("edf", "sjf", "scripted")]
    assert loop.tick(HEALTHY_SHORT, HEALTHY_LONG, 10.0) == []
    assert loop.tick(HEALTHY_SHORT, HEALTHY_LONG, 31.0) == []  # same policy: no switch
    assert loop.tick(HEALTHY_SHORT, HEALTHY_LONG, 62.0) == [Switch("wfq", "edf", "scripted")]
    assert sel.calls == 3 and loop.active == "wfq"


def test_loop_builds_a_lazy_long_view_only_when_the_selector_runs() -> None:
    built: list[float] = []

    def long_view() -> LongView:
        built.append(0.0)
        return HEALTHY_LONG

    loop = MetaLoop(Scripted("edf", "wfq"), POOL, initial="sjf", interval_s=30.0)
    assert loop.tick(HEALTHY_SHORT, long_view, 0.0) == [Switch("edf", "sjf", "scripted")]
    assert loop.tick(HEALTHY_SHORT, long_view, 10.0) == []
    assert loop.tick(HEALTHY_SHORT, long_view, 31.0) == [Switch("wfq", "edf", "scripted")]
    assert len(built) == 2


def test_rollback_restores_the_previous_policy_on_a_ttft_regression() -> None:
    sel = Scripted("edf")
    loop = MetaLoop(sel, POOL, initial="sjf", guards=GuardConfig(rho=1.5, rollback_window_s=30))
    loop.tick(short(ttft_p99_s=1.0), HEALTHY_LONG, 0.0)
    assert loop.tick(short(ttft_p99_s=1.4), HEALTHY_LONG, 5.0) == []
    events = loop.tick(short(ttft_p99_s=1.6), HEALTHY_LONG, 10.0)
    assert len(events) == 1 and isinstance(events[0], Rollback)
    assert (events[0].policy_name, events[0].rolled_back) == ("sjf", "edf")
    assert "TTFT p99" in events[0].reason
    assert loop.active == "sjf" and sel.applied == ["edf", "sjf"]


def test_rollback_on_violation_rate_and_only_inside_the_window() -> None:
    loop = MetaLoop(
        Scripted("edf", "wfq"),
        POOL,
        initial="sjf",
        interval_s=100.0,
        guards=GuardConfig(rho=2.0, rollback_window_s=30),
    )
    loop.tick(short(violation_rate=0.05), HEALTHY_LONG, 0.0)
    assert loop.tick(short(violation_rate=0.9, completions=3), HEALTHY_LONG, 1.0) == []  # too few
    late = loop.tick(short(violation_rate=0.11, ttft_p99_s=5.0), HEALTHY_LONG, 31.0)
    assert late == []  # guard window over: the regression is no longer blamed on the switch
    loop2 = MetaLoop(
        Scripted("edf"), POOL, initial="sjf", guards=GuardConfig(rho=2.0, rollback_window_s=30)
    )
    loop2.tick(short(violation_rate=0.05), HEALTHY_LONG, 0.0)
    events = loop2.tick(short(violation_rate=0.11), HEALTHY_LONG, 2.0)
    assert isinstance(events[0], Rollback) and "violations" in events[0].reason


def test_bypass_enters_on_overload_and_clears_after_a_calm_hold() -> None:
    sel = Scripted("edf", "wfq")
    loop = MetaLoop(sel, POOL, initial="two_lane", guards=GuardConfig(clear_hold_s=10.0))
    on = loop.tick(short(queue_len=5000), HEALTHY_LONG, 0.0)
    assert len(on) == 1 and isinstance(on[0], BypassOn) and "queue" in on[0].reason
    assert loop.active == "fcfs" and loop.bypass_active
    assert loop.tick(short(kv_util=0.99), HEALTHY_LONG, 5.0) == []
    assert loop.tick(HEALTHY_SHORT, HEALTHY_LONG, 10.0) == []
    assert loop.tick(short(violation_rate=0.4), HEALTHY_LONG, 15.0) == []  # not calm: restart
    assert loop.tick(HEALTHY_SHORT, HEALTHY_LONG, 20.0) == []
    off = loop.tick(HEALTHY_SHORT, HEALTHY_LONG, 30.0)
    assert len(off) == 1 and isinstance(off[0], BypassOff) and off[0].policy_name == "two_lane"
    assert loop.active == "two_lane" and not loop.bypass_active and sel.calls == 0


def test_bypass_on_instability_cancels_a_pending_rollback() -> None:
    loop = MetaLoop(Scripted("edf"), POOL, initial="sjf", interval_s=1000.0)
    loop.tick(HEALTHY_SHORT, HEALTHY_LONG, 0.0)
    on = loop.tick(short(violation_rate=0.8, ttft_p99_s=50.0), HEALTHY_LONG, 1.0)
    assert isinstance(on[0], BypassOn) and "instability" in on[0].reason
    for t in range(2, 14):
        loop.tick(HEALTHY_SHORT, HEALTHY_LONG, float(t))
    assert loop.active == "edf" and not loop.bypass_active


def test_loop_without_a_long_view_runs_the_guards_and_keeps_the_choice_due() -> None:
    loop = MetaLoop(Scripted("edf"), POOL, initial="sjf", interval_s=30.0)
    assert loop.tick(HEALTHY_SHORT, None, 0.0) == [] and loop.choice_due(0.0)
    assert loop.tick(short(queue_len=5000), None, 1.0)  # the bypass guard still runs
    assert loop.choice_due(1.0)
