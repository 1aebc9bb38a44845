"""How the examples read the model's text: the router's label and the planner's list,
with the fallbacks they take when a small model (or the simulated engine) answers
something else."""

from __future__ import annotations

import pytest

from tests.examples_support import load_example

router = load_example("router/main.py")
planner = load_example("swe/planner_impl.py")


@pytest.mark.parametrize(("reply", "label"), [
    ("coding", "coding"), ("Coding.", "coding"), (" chat\n", "chat"),
    ("This is a code request", "coding"), ("Chat: just small talk", "chat"),
    ("'coding' or 'chat'", None), ("chatbot coder", None), ("", None),
    ("sim0 sim1 sim2 sim3", None),
])
def test_router_label_from_reply(reply: str, label: str | None) -> None:
    assert router.parse_label(reply) == label


def test_router_keyword_rule_is_the_last_resort() -> None:
    assert router.keyword_label("Fix the BUG in my script") == "coding"
    assert router.keyword_label("how are you today?") == "chat"


def test_planner_reads_a_numbered_or_bulleted_list() -> None:
    reply = "Sure!\n1. **Login page**\n2) Token: refresh flow\n- Logout\n3. Login page"
    assert planner.parse_areas(reply, 3) == ["Login page", "Token refresh flow", "Logout"]
    assert planner.parse_areas(reply, 2) == ["Login page", "Token refresh flow"]
    long_item = "1. " + "x" * 200 + "\n2. y"
    assert [len(a) for a in planner.parse_areas(long_item, 2)] == [planner.MAX_AREA_CHARS, 1]


@pytest.mark.parametrize("reply", ["sim0 sim1 sim2", "1. only one", "- same\n- Same\n", ""])
def test_planner_reply_without_enough_items_does_not_parse(reply: str) -> None:
    assert planner.parse_areas(reply, 2) is None
