"""Token totals with their cost: the store's sums per model (db/content_store.py) folded
into one figure, priced by the config's [prices.MODEL] tables where a model has one."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from daemon.content.settings import Price

PER = 1_000_000  # prices are per million tokens


def usage(by_model: list[dict[str, Any]], prices: Mapping[str, Price]) -> dict[str, Any]:
    """Totals over the models, each model's own line, and the cost of the priced ones;
    `cost` is None when no model of these has a price, and `unpriced` names those that
    have none (their tokens are in the totals, not in the cost)."""
    lines = []
    cost = 0.0
    unpriced = []
    for line in by_model:
        price = prices.get(line["model"])
        line_cost = None
        if price is not None:
            line_cost = (line["prompt_tokens"] * price.prompt_per_mtok
                         + line["completion_tokens"] * price.completion_per_mtok) / PER
            cost += line_cost
        else:
            unpriced.append(line["model"])
        lines.append({**line, "cost": line_cost})
    priced = len(unpriced) < len(lines)
    return {
        "requests": sum(x["requests"] for x in lines),
        "prompt_tokens": sum(x["prompt_tokens"] for x in lines),
        "completion_tokens": sum(x["completion_tokens"] for x in lines),
        "cached_tokens": sum(x["cached_tokens"] for x in lines),
        "cost": round(cost, 9) if priced else None,
        "unpriced": unpriced,
        "by_model": lines,
    }
