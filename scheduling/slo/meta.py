"""Meta controller (H-MAS Sec. 3.4.1, Appendix C): every dT_meta pick the active ordering
policy from V_long; guard each switch with a rollback window and the whole loop with an
emergency bypass (FCFS, unbounded admission) under overload.

Selectors share one interface: ``choose(long_view, now) -> Decision`` plus the hook
``on_applied(policy_name)``, which tells them what actually runs after the loop's guards
(a rollback or bypass may override their pick).
"""

from __future__ import annotations

import json
import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Sequence
from dataclasses import asdict, dataclass, field
from typing import ClassVar, Protocol

from scheduling.slo.views import LongView, ShortView

BYPASS_POLICY = "fcfs"


@dataclass(frozen=True, slots=True)
class Decision:
    policy_name: str
    reason: str


class PolicySelector(Protocol):
    def choose(self, view: LongView, now: float) -> Decision: ...

    def on_applied(self, policy_name: str) -> None: ...


class MetaPolicy(ABC):
    """The meta layer's policy interface (re-exported by scheduling.layers, with the
    built-ins): picks the active ordering policy every meta interval. It lives here so that
    scheduling.slo.meta_llm can build on it without importing layer_policies, which lists it."""

    name: ClassVar[str]
    # Whether the daemon runs the rollback guard and the emergency bypass around it.
    guards: ClassVar[bool] = True

    @abstractmethod
    def choose(self, view: LongView, now: float) -> Decision:
        """The ordering policy to run next (a name in the pool) and why."""

    def on_applied(self, policy_name: str) -> None:  # noqa: B027 - an optional hook
        """What actually runs after the guards or an operator acted; may differ from
        the last choice."""


@dataclass(frozen=True, slots=True)
class RuleThresholds:
    min_completions: int = 20
    anomaly_violation: float = 0.6
    surge_ratio: float = 3.0
    hol_length_cv: float = 1.0
    hol_ttft_violation: float = 0.1
    unfair_jain: float = 0.9
    deadline_violation: float = 0.1
    # TTFT violations past this are overload: two-lane, whose late queue sheds requests
    # that cannot make it (EDF or WFQ would serve them first and lose the rest too).
    # The default (off) keeps the paper's map.
    overload_ttft_violation: float = float("inf")
    # EDF only when at least this share of the violations are TTFT misses: ordering cannot
    # fix a TPOT miss, and EDF under TPOT pressure just reshuffles the queue.
    deadline_ttft_share: float = 0.0


class RuleMap:
    """Failure pattern -> policy, first match wins: anomaly -> FCFS, head-of-line blocking
    (length variance with TTFT violations) or overload -> two-lane, unfair tenants -> WFQ,
    deadline misses -> EDF; with no dominant failure the current policy stays.

    ``lanes`` names the two-lane policy the HOL and overload rules pick: ``two_lane_esg``
    (late queue by ESG density) in the replay's full stack, see bench/slo.py."""

    def __init__(self, initial: str = "sjf", thresholds: RuleThresholds | None = None,
                 lanes: str = "two_lane") -> None:
        self.current = initial
        self.t = thresholds or RuleThresholds()
        self.lanes = lanes

    def on_applied(self, policy_name: str) -> None:
        self.current = policy_name

    def choose(self, view: LongView, now: float) -> Decision:
        if view.completions < self.t.min_completions:
            return Decision(self.current, f"only {view.completions} completions: keep")
        for rule in (self._anomaly, self._hol, self._unfair, self._deadline):
            decision = rule(view)
            if decision is not None:
                return decision
        return Decision(self.current, "no dominant failure pattern: keep")

    def _anomaly(self, v: LongView) -> Decision | None:
        prev = v.prev_arrival_rate
        surge = prev > 0 and v.arrival_rate > self.t.surge_ratio * prev
        if surge or v.violation_rate >= self.t.anomaly_violation:
            why = f"anomaly: rate {v.arrival_rate:.2f}/s (prev {v.prev_arrival_rate:.2f}/s), "
            return Decision("fcfs", why + f"violations {v.violation_rate:.0%}")
        return None

    def _hol(self, v: LongView) -> Decision | None:
        varied = v.output_len_cv >= self.t.hol_length_cv
        if varied and v.ttft_violation_rate >= self.t.hol_ttft_violation:
            why = f"HOL blocking: length CV {v.output_len_cv:.2f}, TTFT violations "
            return Decision(self.lanes, why + f"{v.ttft_violation_rate:.0%}")
        if v.ttft_violation_rate >= self.t.overload_ttft_violation:
            why = f"overload: TTFT violations {v.ttft_violation_rate:.0%}, shed to a late queue"
            return Decision(self.lanes, why)
        return None

    def _unfair(self, v: LongView) -> Decision | None:
        if v.fairness < self.t.unfair_jain:
            return Decision("wfq", f"unfair tenant attainment: Jain index {v.fairness:.2f}")
        return None

    def _deadline(self, v: LongView) -> Decision | None:
        ttft_share = v.ttft_violation_rate / v.violation_rate if v.violation_rate > 0 else 0.0
        if (v.violation_rate >= self.t.deadline_violation
                and ttft_share >= self.t.deadline_ttft_share):
            return Decision("edf", f"deadline misses: {v.violation_rate:.0%} violate SLO")
        return None


Context = tuple[int, ...]


def default_context(view: LongView) -> Context:
    """Coarse regime buckets: violations present, length variance high, tenants unfair."""
    return (
        int(view.violation_rate >= 0.1),
        int(view.output_len_cv >= 1.0),
        int(view.fairness < 0.9),
    )


class ContextualBandit:
    """UCB1 per context bucket. The reward for the previous pick is read from the next view
    (ESG ratio or SLO attainment over its window), so dT_meta should be at least as long as
    the long window for the credit to land on the right policy."""

    def __init__(
        self,
        arms: Sequence[str],
        reward: str = "esg",
        exploration: float = 0.5,
        context: Callable[[LongView], Context] = default_context,
    ) -> None:
        if reward not in ("esg", "goodput"):
            raise ValueError("reward must be 'esg' or 'goodput'")
        self.arms, self.reward, self.c, self.context = tuple(arms), reward, exploration, context
        self._stats: dict[tuple[Context, str], tuple[int, float]] = {}
        self._last: tuple[Context, str] | None = None

    def on_applied(self, policy_name: str) -> None:
        if self._last is not None and policy_name in self.arms:
            self._last = (self._last[0], policy_name)

    def choose(self, view: LongView, now: float) -> Decision:
        if self._last is not None:
            self._credit(self._last, self._reward(view))
        ctx = self.context(view)
        arm, why = self._pick(ctx)
        self._last = (ctx, arm)
        return Decision(arm, f"bandit context {ctx}: {why}")

    def _reward(self, view: LongView) -> float:
        return view.esg_ratio if self.reward == "esg" else 1.0 - view.violation_rate

    def _credit(self, key: tuple[Context, str], reward: float) -> None:
        n, mean = self._stats.get(key, (0, 0.0))
        self._stats[key] = (n + 1, mean + (reward - mean) / (n + 1))

    def _pick(self, ctx: Context) -> tuple[str, str]:
        counts = {a: self._stats.get((ctx, a), (0, 0.0)) for a in self.arms}
        for arm, (n, _) in counts.items():
            if n == 0:
                return arm, "untried arm"
        total = sum(n for n, _ in counts.values())
        bonus = 2 * math.log(total)
        scores = {a: mu + self.c * math.sqrt(bonus / n) for a, (n, mu) in counts.items()}
        best = max(self.arms, key=lambda a: scores[a])
        return best, f"UCB {scores[best]:.3f} (mean {counts[best][1]:.3f}, n={counts[best][0]})"


_ALLOWED_KEYS = frozenset({"policy", "reason"})


def parse_llm_decision(text: str, pool: Collection[str]) -> Decision | str:
    """A Decision from a strict-JSON reply, or the reason the reply is rejected."""
    try:
        obj = json.loads(text)
    except (json.JSONDecodeError, TypeError) as exc:
        return f"malformed JSON ({exc.__class__.__name__})"
    if not isinstance(obj, dict):
        return "reply is not a JSON object"
    if set(obj) != _ALLOWED_KEYS:
        return f"keys {sorted(obj)} != {sorted(_ALLOWED_KEYS)}"
    policy, reason = obj["policy"], obj["reason"]
    if not isinstance(policy, str) or policy not in pool:
        return f"policy {policy!r} not in pool"
    if not isinstance(reason, str) or not reason.strip() or len(reason) > 500:
        return "reason must be a non-empty string under 500 characters"
    return Decision(policy, f"LLM: {reason.strip()}")


LLM_ACCEPTED = "accepted"
LLM_INVALID = "invalid"
LLM_PENDING = "pending"


@dataclass(frozen=True, slots=True)
class LlmOutcome:
    """What one decision of the LLM selector rested on. ``kind`` is ``accepted``,
    ``invalid`` (the reply failed validation), ``pending`` (no answer has come since the
    last decision), or whatever the caller reported for a call that gave no answer
    (the daemon: ``timeout``, ``no_worker``, ``error``); all but ``accepted`` mean
    ``decision`` is the rule map's."""

    kind: str
    detail: str
    decision: Decision


@dataclass
class LlmSelector:
    """The paper's LLM meta controller with the daemon doing the call: ``build_prompt`` gives
    the text to send, ``on_response`` takes the reply (``on_failure`` says why there is
    none), ``choose`` validates it against the pool and falls back to the rule map on any
    invalid or missing reply (Appendix C.2). A reply is used once. ``outcome`` and
    ``last_view`` describe the latest decision, for the trace and the next prompt."""

    pool: Sequence[str]
    fallback: RuleMap
    _reply: str | None = field(default=None, init=False)
    _failure: tuple[str, str] | None = field(default=None, init=False)
    outcome: LlmOutcome | None = field(default=None, init=False)
    last_view: LongView | None = field(default=None, init=False)

    def on_applied(self, policy_name: str) -> None:
        self.fallback.on_applied(policy_name)

    def on_response(self, text: str) -> None:
        self._reply, self._failure = text, None

    def on_failure(self, kind: str, detail: str) -> None:
        self._reply, self._failure = None, (kind, detail)

    def build_prompt(self, view: LongView) -> str:
        state = {k: v if not isinstance(v, float) else round(v, 4) for k, v in asdict(view).items()}
        return (
            "You pick the request-ordering policy of an LLM serving scheduler.\n"
            f"Current policy: {self.fallback.current}. Allowed policies: {', '.join(self.pool)}.\n"
            "Guidance: deadline misses -> edf; high output-length variance with TTFT violations"
            " -> two_lane; unfair tenant attainment -> wfq; anomalies or overload -> fcfs.\n"
            f"Long-horizon view (rates per second, times in seconds): {json.dumps(state)}\n"
            'Answer with only a JSON object, exactly {"policy": "<allowed policy>", '
            '"reason": "<one sentence>"}, no other keys and no other text.'
        )

    def choose(self, view: LongView, now: float) -> Decision:
        reply, failure = self._reply, self._failure
        self._reply = self._failure = None
        self.last_view = view
        if reply is not None:
            verdict = parse_llm_decision(reply, self.pool)
            if isinstance(verdict, Decision):
                self.outcome = LlmOutcome(LLM_ACCEPTED, "", verdict)
                return verdict
            kind, detail = LLM_INVALID, verdict
        else:
            kind, detail = failure or (LLM_PENDING, "no reply")
        rule = self.fallback.choose(view, now)
        why = (f"LLM output rejected ({detail})" if kind == LLM_INVALID
               else f"no LLM decision ({kind}: {detail})")
        decision = Decision(rule.policy_name, f"{why}; rules: {rule.reason}")
        self.outcome = LlmOutcome(kind, detail, decision)
        return decision


@dataclass(frozen=True, slots=True)
class GuardConfig:
    """Rollback (Eq. 12) and bypass thresholds. The floors stop a near-zero pre-switch
    baseline from turning a single slow request into a rollback."""

    rho: float = 1.5
    rollback_window_s: float = 30.0
    min_completions: int = 10
    ttft_floor_s: float = 0.05
    violation_floor: float = 0.02
    bypass_queue_len: int = 2000
    bypass_kv_util: float = 0.98
    bypass_violation: float = 0.5
    clear_queue_len: int = 500
    clear_kv_util: float = 0.9
    clear_violation: float = 0.2
    clear_hold_s: float = 10.0


# What the daemon and the replay's meta stacks run (tuned in bench/slo.py). Overload is
# not an anomaly: with the library defaults a saturated worker falls back to FCFS with
# unbounded admission, the policy that loses most under overload. Here only a collapse of
# nearly every SLO sends the rule map to FCFS, and only a queue or memory at the brink
# trips the emergency bypass (violations alone never do: a short window of late
# completions is what serving a backlog looks like).
SERVING_RULES = RuleThresholds(anomaly_violation=0.95, surge_ratio=10.0, hol_length_cv=0.8,
                               overload_ttft_violation=0.3, deadline_ttft_share=0.5)
SERVING_GUARD = GuardConfig(bypass_violation=float("inf"))


@dataclass(frozen=True, slots=True)
class _Armed:
    previous: str
    since: float
    ttft_p99_s: float
    violation_rate: float


class RollbackGuard:
    """After a switch, compare the short view with its value just before the switch; if
    TTFT p99 or the violation rate exceeds rho times it within the window, roll back."""

    def __init__(self, config: GuardConfig) -> None:
        self.config = config
        self._armed: _Armed | None = None

    def arm(self, previous: str, baseline: ShortView, now: float) -> None:
        c = self.config
        ttft = max(baseline.ttft_p99_s, c.ttft_floor_s)
        self._armed = _Armed(previous, now, ttft, max(baseline.violation_rate, c.violation_floor))

    def disarm(self) -> None:
        self._armed = None

    def check(self, view: ShortView, now: float) -> tuple[str, str] | None:
        """(policy to restore, reason) when a rollback is due."""
        armed, c = self._armed, self.config
        if armed is None:
            return None
        if now - armed.since > c.rollback_window_s:
            self._armed = None
            return None
        if view.completions < c.min_completions:
            return None
        return self._verdict(armed, view)

    def _verdict(self, armed: _Armed, view: ShortView) -> tuple[str, str] | None:
        rho = self.config.rho
        if view.ttft_p99_s > rho * armed.ttft_p99_s:
            why = f"TTFT p99 {view.ttft_p99_s:.3f}s > {rho}x pre-switch {armed.ttft_p99_s:.3f}s"
        elif view.violation_rate > rho * armed.violation_rate:
            why = f"violations {view.violation_rate:.1%} > {rho}x pre-switch"
            why += f" {armed.violation_rate:.1%}"
        else:
            return None
        self._armed = None
        return armed.previous, why


class BypassGuard:
    """Enters on overload (queue, KV or violations past the bypass thresholds); clears only
    after every signal has stayed under the lower clear thresholds for ``clear_hold_s``."""

    def __init__(self, config: GuardConfig) -> None:
        self.config = config
        self.active = False
        self._calm_since: float | None = None

    def update(self, view: ShortView, now: float) -> str | None:
        """The reason when the state flips, else None."""
        if not self.active:
            why = self._overload(view)
            self.active = why is not None
            return why
        return self._try_clear(view, now)

    def _overload(self, v: ShortView) -> str | None:
        c = self.config
        if v.queue_len >= c.bypass_queue_len:
            return f"overload: queue {v.queue_len} >= {c.bypass_queue_len}"
        if v.kv_util >= c.bypass_kv_util:
            return f"overload: KV utilisation {v.kv_util:.0%} >= {c.bypass_kv_util:.0%}"
        if v.completions >= c.min_completions and v.violation_rate >= c.bypass_violation:
            return f"instability: violations {v.violation_rate:.0%} >= {c.bypass_violation:.0%}"
        return None

    def _try_clear(self, v: ShortView, now: float) -> str | None:
        c = self.config
        calm = (
            v.queue_len <= c.clear_queue_len
            and v.kv_util <= c.clear_kv_util
            and v.violation_rate <= c.clear_violation
        )
        if not calm:
            self._calm_since = None
            return None
        if self._calm_since is None:
            self._calm_since = now
        if now - self._calm_since < c.clear_hold_s:
            return None
        self.active, self._calm_since = False, None
        return f"guard cleared: calm for {c.clear_hold_s:.0f}s"


@dataclass(frozen=True, slots=True)
class Switch:
    policy_name: str
    previous: str
    reason: str


@dataclass(frozen=True, slots=True)
class Rollback:
    policy_name: str
    rolled_back: str
    reason: str


@dataclass(frozen=True, slots=True)
class BypassOn:
    reason: str
    policy_name: str = BYPASS_POLICY


@dataclass(frozen=True, slots=True)
class BypassOff:
    policy_name: str
    reason: str


MetaEvent = Switch | Rollback | BypassOn | BypassOff


class MetaLoop:
    """Call ``tick`` every scheduling cycle; guards run each tick, the selector every
    ``interval_s``. After any returned event, rebuild the queue under ``active`` and run the
    Statera agent with ``bypass=bypass_active``. The initial policy defaults to SJF, as in
    the paper's Algorithm 1."""

    def __init__(
        self,
        selector: PolicySelector,
        pool: Collection[str],
        initial: str = "sjf",
        interval_s: float = 30.0,
        guards: GuardConfig | None = None,
    ) -> None:
        config = guards or GuardConfig()
        self.selector, self.pool, self.interval_s = selector, pool, interval_s
        self.rollback, self.bypass = RollbackGuard(config), BypassGuard(config)
        self._policy = initial
        self._last_choice: float | None = None

    @property
    def active(self) -> str:
        return BYPASS_POLICY if self.bypass.active else self._policy

    @property
    def bypass_active(self) -> bool:
        return self.bypass.active

    def choice_due(self, now: float) -> bool:
        """Whether the next tick that gets a long view runs the selector."""
        return self._last_choice is None or now - self._last_choice >= self.interval_s

    def tick(self, short: ShortView, long: LongView | Callable[[], LongView] | None,
             now: float) -> list[MetaEvent]:
        """`long` may be a function building the long view: only the selector reads it,
        once per `interval_s`, and building it walks the whole long window. None: no view
        is built yet (the daemon builds it off its event loop); the guards run and the
        choice stays due until a view comes."""
        flipped = self._bypass_step(short, now)
        if flipped is not None or self.bypass.active:
            return [flipped] if flipped is not None else []
        rolled = self._rollback_step(short, now)
        if rolled is not None:
            return [rolled]
        switched = self._select_step(short, long, now)
        return [switched] if switched is not None else []

    def _bypass_step(self, short: ShortView, now: float) -> MetaEvent | None:
        reason = self.bypass.update(short, now)
        if reason is None:
            return None
        if self.bypass.active:
            # A switch under test is moot once the safe baseline takes over.
            self.rollback.disarm()
            return BypassOn(reason)
        self._last_choice = now
        return BypassOff(self._policy, reason)

    def _rollback_step(self, short: ShortView, now: float) -> Rollback | None:
        verdict = self.rollback.check(short, now)
        if verdict is None:
            return None
        restored, why = verdict
        bad, self._policy, self._last_choice = self._policy, restored, now
        self.selector.on_applied(restored)
        return Rollback(restored, bad, why)

    def _select_step(self, short: ShortView, long: LongView | Callable[[], LongView] | None,
                     now: float) -> Switch | None:
        if long is None or not self.choice_due(now):
            return None
        self._last_choice = now
        decision = self.selector.choose(long if isinstance(long, LongView) else long(), now)
        if decision.policy_name == self._policy or decision.policy_name not in self.pool:
            return None
        previous, self._policy = self._policy, decision.policy_name
        self.rollback.arm(previous, short, now)
        self.selector.on_applied(decision.policy_name)
        return Switch(decision.policy_name, previous, decision.reason)
