"""Content tracing's settings, read from the config (daemon/config.py):

    content_tracing = false          every tenant's default: nothing is stored
    content_max_chars = 16384        the most kept of each field (a prompt, a completion,
                                     a tool call's arguments); the rest is cut with a marker
    content_redact = [REGEX, ...]    matches are replaced before anything is stored
    [slo.tenants.NAME] content_tracing = true | false   one tenant's own choice
    [prices.MODEL] prompt_per_mtok = X, completion_per_mtok = Y   cost per million tokens

This module takes plain values, not the Config, so that the config's validation can ask
it without an import cycle.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

TRACING_KEY = "content_tracing"
# API keys of the common providers' shape, AWS access key ids, e-mail addresses. Each
# match starts where its run of characters starts (a literal prefix, or a lookbehind), so
# a scan is linear: an unanchored `[...]+@` retries from every character of a long run
# without an @ and takes quadratic time (0.56 s on a 16k-character field).
DEFAULT_REDACT = (
    r"sk-[A-Za-z0-9_-]{20,}",
    r"AKIA[0-9A-Z]{16}",
    r"(?<![A-Za-z0-9._%+-])[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[A-Za-z]{2,}",
)
REDACTED = "[REDACTED]"
MIN_MAX_CHARS = 64  # room for the marker and something before it
PRICE_KEYS = ("prompt_per_mtok", "completion_per_mtok")


@dataclass(frozen=True)
class Price:
    prompt_per_mtok: float
    completion_per_mtok: float


@dataclass(frozen=True)
class ContentSettings:
    tracing: bool = False
    max_chars: int = 16384
    redact: tuple[re.Pattern[str], ...] = ()
    tenant_tracing: Mapping[str, bool] = field(default_factory=dict)
    prices: Mapping[str, Price] = field(default_factory=dict)

    def traces(self, tenant: str) -> bool:
        return self.tenant_tracing.get(tenant, self.tracing)


def parse(tracing: bool, max_chars: int, redact: Any, tenants: Any,
          prices: Any) -> ContentSettings:
    """The settings, or a ValueError naming the config key that is wrong."""
    if isinstance(max_chars, bool) or not isinstance(max_chars, int) \
            or max_chars < MIN_MAX_CHARS:
        raise ValueError(f"config key 'content_max_chars' must be an integer >= "
                         f"{MIN_MAX_CHARS}, got {max_chars!r}")
    return ContentSettings(bool(tracing), max_chars, _patterns(redact),
                           _tenant_tracing(tenants), _prices(prices))


def from_config(cfg: Any) -> ContentSettings:
    """From a daemon.config.Config (validated at load, so this does not raise there)."""
    return parse(cfg.content_tracing, cfg.content_max_chars, cfg.content_redact,
                 cfg.slo.get("tenants", {}), cfg.prices)


def _patterns(raw: Any) -> tuple[re.Pattern[str], ...]:
    if not isinstance(raw, list | tuple) or not all(isinstance(p, str) for p in raw):
        raise ValueError(f"config key 'content_redact' must be a list of regular "
                         f"expressions, got {raw!r}")
    out = []
    for n, pattern in enumerate(raw):
        try:
            out.append(re.compile(pattern))
        except re.error as exc:
            raise ValueError(f"config key 'content_redact[{n}]': {pattern!r} is not a "
                             f"regular expression: {exc}") from None
    return tuple(out)


def _tenant_tracing(tenants: Any) -> dict[str, bool]:
    out: dict[str, bool] = {}
    if not isinstance(tenants, Mapping):
        return out  # the [slo] table's own parsing names that error
    for name, table in tenants.items():
        if not isinstance(table, Mapping) or TRACING_KEY not in table:
            continue
        value = table[TRACING_KEY]
        if not isinstance(value, bool):
            raise ValueError(f"config key 'slo.tenants.{name}.{TRACING_KEY}' must be true "
                             f"or false, got {value!r}")
        out[str(name)] = value
    return out


def _prices(raw: Any) -> dict[str, Price]:
    if not isinstance(raw, Mapping):
        raise ValueError("config key 'prices' must be a table of [prices.MODEL] tables")
    out: dict[str, Price] = {}
    for model, table in raw.items():
        key = f"prices.{model}"
        if not isinstance(table, Mapping) or set(table) != set(PRICE_KEYS):
            raise ValueError(f"config key '{key}' must be {{ prompt_per_mtok = X, "
                             f"completion_per_mtok = Y }}")
        values = []
        for name in PRICE_KEYS:
            value = table[name]
            if isinstance(value, bool) or not isinstance(value, int | float) \
                    or not value >= 0:
                raise ValueError(f"config key '{key}.{name}' must be a number >= 0, "
                                 f"got {value!r}")
            values.append(float(value))
        out[str(model)] = Price(*values)
    return out
