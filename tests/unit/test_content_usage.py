"""Token totals priced by [prices.MODEL] (daemon/content/usage.py): a model without a
price is in the totals, not in the cost, and named; no price at all is no cost."""

from __future__ import annotations

import pytest

from daemon.content.settings import Price
from daemon.content.usage import usage


def line(model: str, p: int, c: int) -> dict[str, object]:
    return {"model": model, "requests": 1, "prompt_tokens": p, "completion_tokens": c,
            "cached_tokens": 0}


def test_priced_and_unpriced_models() -> None:
    out = usage([line("a", 1_000_000, 500_000), line("b", 10, 20)],
                {"a": Price(prompt_per_mtok=2.0, completion_per_mtok=8.0)})
    assert out["cost"] == pytest.approx(2.0 + 4.0)
    assert out["unpriced"] == ["b"] and out["prompt_tokens"] == 1_000_010
    assert [x["cost"] for x in out["by_model"]] == [pytest.approx(6.0), None]


def test_no_price_is_no_cost() -> None:
    out = usage([line("a", 5, 5)], {})
    assert out["cost"] is None and out["completion_tokens"] == 5
    assert usage([], {})["requests"] == 0
