"""`Cluster.set_state_cost`: the host's price of a session's state, as views show it."""

from __future__ import annotations

import math

import pytest

from scheduling.agents.cluster import Cluster
from scheduling.agents.policy import Directives


def _cluster() -> Cluster:
    c = Cluster({"W": Directives()})
    c.add_instance("W")
    return c


def test_views_carry_the_state_cost_while_the_session_has_live_calls() -> None:
    c = _cluster()
    c.set_state_cost("s", 2.5)  # before its first call: kept for it
    c.create("f0", "s", "W", 0.0)
    c.create("g0", "t", "W", 0.0)
    view = c.view(0.0)
    assert view.sessions["s"].state_s == 2.5 and view.sessions["t"].state_s == 0.0
    c.set_state_cost("s", 4.0)
    assert c.view(0.0).sessions["s"].state_s == 4.0
    started = c.start_next("W#0", 0.0)
    assert started is not None and started.future.future_id == "f0"
    c.finish("W#0", "f0", None, True, 1.0)
    assert "s" not in c.view(1.0).sessions  # no live call
    c.create("f1", "s", "W", 2.0)  # the next turn: its state is still priced
    assert c.view(2.0).sessions["s"].state_s == 4.0


def test_a_forgotten_session_starts_again_with_no_state_cost() -> None:
    c = _cluster()
    c.create("f0", "s", "W", 0.0)
    c.set_state_cost("s", 3.0)
    c.forget_session("s")
    c.create("f1", "s", "W", 1.0)
    assert c.view(1.0).sessions["s"].state_s == 0.0


@pytest.mark.parametrize("bad", [-1.0, math.nan, math.inf])
def test_a_state_cost_must_be_finite_and_not_negative(bad: float) -> None:
    c = _cluster()
    with pytest.raises(ValueError, match="state_s"):
        c.set_state_cost("s", bad)
