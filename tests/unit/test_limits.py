"""Admission limits: prompt length, global queue, per-token rate, with a virtual clock."""

from __future__ import annotations

import pytest

from daemon.api.limits import Limits, TokenBucket
from daemon.config import Config
from daemon.errors import ApiError


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _limits(clock: Clock, **kw: float) -> Limits:
    return Limits(Config(**kw), clock=clock)  # type: ignore[arg-type]


def _refusal(limits: Limits, tenant: str = "tok-a", chars: int = 10, queued: int = 0) -> ApiError:
    with pytest.raises(ApiError) as info:
        limits.check(tenant, chars, queued)
    return info.value


def test_bucket_refills_at_its_rate_up_to_its_burst() -> None:
    bucket = TokenBucket(rate=2.0, burst=3.0, tokens=3.0, stamp=0.0)
    assert [bucket.take(0.0) for _ in range(3)] == [0.0, 0.0, 0.0]
    assert bucket.take(0.0) == pytest.approx(0.5)
    assert bucket.take(0.25) == pytest.approx(0.25)
    assert bucket.take(0.5) == 0.0
    assert bucket.take(100.0) == 0.0 and bucket.tokens == pytest.approx(2.0)


def test_rate_limit_answers_429_with_retry_after_per_token() -> None:
    clock = Clock()
    limits = _limits(clock, rate_limit_rps=2, rate_limit_burst=2)
    limits.check("tok-a", 10, 0)
    limits.check("tok-a", 10, 0)
    err = _refusal(limits)
    assert err.status == 429 and err.code == "rate_limited"
    assert err.headers["Retry-After"] == "1" and err.headers["retry-after-ms"] == "500"
    assert "rate_limit_rps" in err.message
    limits.check("tok-b", 10, 0)  # another tenant has its own bucket
    clock.now += 0.5
    limits.check("tok-a", 10, 0)


def test_slow_rates_round_retry_after_up_to_whole_seconds() -> None:
    clock = Clock()
    limits = _limits(clock, rate_limit_rps=0.2)
    limits.check("tok-a", 1, 0)
    err = _refusal(limits)
    assert err.headers["Retry-After"] == "5"


def test_queue_full_is_429_and_does_not_spend_the_tenants_rate() -> None:
    clock = Clock()
    limits = _limits(clock, max_queued_requests=3, rate_limit_rps=1, rate_limit_burst=1)
    err = _refusal(limits, queued=3)
    assert err.status == 429 and err.code == "queue_full" and err.headers["Retry-After"] == "1"
    assert "max_queued_requests" in err.message
    limits.check("tok-a", 10, 2)  # the refused request above took no token from the bucket


def test_too_long_prompt_is_400_naming_the_limit_and_spends_nothing() -> None:
    clock = Clock()
    limits = _limits(clock, max_prompt_chars=100, rate_limit_rps=1, rate_limit_burst=1)
    with pytest.raises(ApiError) as info:
        limits.check("tok-a", 101, 0, param="prompt")
    err = info.value
    assert err.status == 400 and err.code == "prompt_too_long" and err.param == "prompt"
    assert "101" in err.message and "max_prompt_chars" in err.message
    limits.check("tok-a", 100, 0)


def test_zero_turns_every_limit_off() -> None:
    limits = _limits(Clock(), max_prompt_chars=0, max_queued_requests=0, rate_limit_rps=0)
    for _ in range(1000):
        limits.check("tok-a", 10**9, 10**9)
