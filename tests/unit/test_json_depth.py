"""The JSON depth limit is read off the bytes: brackets in strings, escaped quotes and
escaped backslashes must not fool it (daemon/api/errors.py nests_too_deep)."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from daemon.api.errors import MAX_JSON_DEPTH, nests_too_deep

# Leaves that put brackets, quotes and backslashes inside strings and keys.
TRICKY = ["[[[[{{{{", "}]", '\\"[', "x\\", '"', '\\\\"{', "", 1, None]


def depth(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max((depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((depth(v) for v in value), default=0)
    return 0


def chain(rng: random.Random, levels: int) -> Any:
    """`levels` nested arrays and objects, tricky strings beside each."""
    if levels == 0:
        return rng.choice(TRICKY)
    side = [rng.choice(TRICKY) for _ in range(rng.randint(0, 2))]
    inner = chain(rng, levels - 1)
    if rng.random() < 0.5:
        return [*side, inner, *side]
    return {f"{rng.choice(TRICKY)}{i}": v for i, v in enumerate([*side, inner])}


@pytest.mark.parametrize("levels", [0, 1, MAX_JSON_DEPTH, MAX_JSON_DEPTH + 1, 500])
def test_exact_nesting_is_measured(levels: int) -> None:
    body = ("[" * levels + "]" * levels).encode()
    assert nests_too_deep(body) == (levels > MAX_JSON_DEPTH)


def test_brackets_in_strings_do_not_count() -> None:
    text = json.dumps({"a": "[" * 1000, "b": ['\\"' + "{" * 1000], "c\\": "]" * 1000})
    assert not nests_too_deep(text.encode())


def test_agrees_with_the_decoded_depth() -> None:
    rng = random.Random(21)
    for _ in range(2000):
        value = chain(rng, rng.randint(0, 2 * MAX_JSON_DEPTH))
        body = json.dumps(value, ensure_ascii=rng.random() < 0.5).encode()
        assert nests_too_deep(body) == (depth(value) > MAX_JSON_DEPTH), body[:200]
