"""Admission limits checked before the core creates anything for a request.

Prompt length (approximated by characters: the daemon does not tokenize), the global
queue length and a token bucket per tenant (the request's tenant,
daemon/core/tenants.py: the one the SLO stack schedules it as; a token without a
tenant is its own). A request over a limit is answered at once and leaves no program,
request or trace behind.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from litestar import Request

from daemon.config import Config
from daemon.errors import ApiError

if TYPE_CHECKING:
    from daemon.core.core import Core

QUEUE_FULL_RETRY_S = 1.0


@dataclass(slots=True)
class TokenBucket:
    rate: float  # tokens per second
    burst: float
    tokens: float
    stamp: float

    def take(self, now: float) -> float:
        """Take one token: 0.0 when admitted, else seconds until one will be there."""
        self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return 0.0
        return (1.0 - self.tokens) / self.rate


def _too_many(message: str, code: str, retry_after_s: float) -> ApiError:
    # Retry-After takes whole seconds; the OpenAI clients also read retry-after-ms.
    headers = {"Retry-After": str(max(1, math.ceil(retry_after_s))),
               "retry-after-ms": str(max(1, math.ceil(retry_after_s * 1000)))}
    return ApiError(429, message, code, headers=headers)


class Limits:
    """Per-daemon limit state; `check` raises ApiError for the first limit exceeded."""

    def __init__(self, config: Config, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_prompt_chars = config.max_prompt_chars
        self.max_queued = config.max_queued_requests
        self.rate = config.rate_limit_rps
        self.burst = float(config.rate_limit_burst or max(1, math.ceil(self.rate)))
        self._clock = clock
        self._buckets: dict[str, TokenBucket] = {}

    def check(self, tenant: str, prompt_chars: int, queued: int, param: str = "messages") -> None:
        # Cheapest and permanent refusals first; the bucket is debited only for a request
        # that passes everything else, so refused requests do not eat a tenant's rate.
        if self.max_prompt_chars and prompt_chars > self.max_prompt_chars:
            # 400, not 429: the same prompt will never fit, and OpenAI clients retry 429s.
            raise ApiError(400, f"prompt is {prompt_chars} characters; the limit is "
                           f"{self.max_prompt_chars} (max_prompt_chars)", "prompt_too_long",
                           param=param)
        if self.max_queued and queued >= self.max_queued:
            raise _too_many(f"the daemon's queue is full ({queued} requests waiting; "
                            f"max_queued_requests = {self.max_queued}); retry later",
                            "queue_full", QUEUE_FULL_RETRY_S)
        if self.rate > 0:
            wait = self._bucket(tenant).take(self._clock())
            if wait > 0:
                raise _too_many(f"rate limit for tenant '{tenant}' exceeded ({self.rate:g} "
                                f"requests/s, burst {self.burst:g}; rate_limit_rps); retry in "
                                f"{wait:.2f}s", "rate_limited", wait)

    def _bucket(self, tenant: str) -> TokenBucket:
        bucket = self._buckets.get(tenant)
        if bucket is None:
            bucket = TokenBucket(self.rate, self.burst, self.burst, self._clock())
            self._buckets[tenant] = bucket
        return bucket


def admit(request: Request[Any, Any, Any], core: Core, chars: int, param: str,
          tenant: str) -> None:
    """The gateway's admission check: after validation, before the program is created."""
    limits: Limits = request.app.state["limits"]
    limits.check(tenant, chars, len(core.queue), param)
