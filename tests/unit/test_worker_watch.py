"""The progress watch: which running requests count as stalled, and for how long a
worker that stalled stays suspect. Virtual time: `now` is passed in."""

from __future__ import annotations

from daemon.workers.watch import MAX_SUSPECT_S, ProgressWatch


def _watch(stall_s: float = 30.0, limit_s: float = 600.0) -> ProgressWatch:
    w = ProgressWatch(stall_s, limit_s)
    w.registered("w0", 0.0)
    w.engine_steps("w0", 0, 0.0)
    return w


def test_a_request_on_an_idle_engine_stalls_after_the_timeout() -> None:
    w = _watch()
    w.dispatched("r1", "w0", 10.0, 0)
    assert w.stalled(40.0) == {}
    [stall] = w.stalled(40.1)["w0"]
    assert stall.request_id == "r1" and "no engine step" in stall.reason


def test_deltas_keep_a_request_alive() -> None:
    w = _watch()
    w.dispatched("r1", "w0", 0.0, 0)
    for t in range(10, 200, 10):
        w.progressed("r1", float(t))
        assert w.stalled(float(t) + 29.0) == {}
    assert w.stalled(190.0 + 30.5)


def test_an_engine_that_steps_is_busy_not_stuck() -> None:
    """A long prefill or a wait behind other requests: the engine's step counter moves,
    so the request is left alone until the overall limit."""
    w = _watch(stall_s=30.0, limit_s=600.0)
    w.dispatched("r1", "w0", 0.0, 0)
    for t in range(1, 601):
        w.engine_steps("w0", t, float(t))
        assert w.stalled(float(t)) == {}, t
    w.engine_steps("w0", 601, 601.0)
    [stall] = w.stalled(601.0)["w0"]
    assert "not for this request" in stall.reason


def test_an_engine_that_stops_stepping_stalls_its_requests() -> None:
    w = _watch()
    w.dispatched("r1", "w0", 0.0, 0)
    w.engine_steps("w0", 5, 50.0)  # stepped until t=50, then nothing
    assert w.stalled(80.0) == {}
    assert w.stalled(80.5)


def test_zero_turns_each_timeout_off() -> None:
    w = _watch(stall_s=0.0, limit_s=0.0)
    w.dispatched("r1", "w0", 0.0, 0)
    assert w.stalled(1e9) == {}


def test_forgotten_requests_are_not_reported() -> None:
    w = _watch()
    w.dispatched("r1", "w0", 0.0, 0)
    w.dispatched("r2", "w0", 0.0, 0)
    w.forget("r1")
    assert [s.request_id for s in w.stalled(100.0)["w0"]] == ["r2"]


def test_tokens_are_counted_per_dispatch() -> None:
    w = _watch()
    w.dispatched("r1", "w0", 0.0, output_tokens=7)  # a failover: 7 came from the last worker
    assert w.tokens_this_dispatch("r1", 12) == 5
    assert w.tokens_this_dispatch("unknown", 12) is None


def test_suspect_time_doubles_with_each_stall_and_is_capped() -> None:
    w = _watch(stall_s=30.0)
    assert w.suspect("w0", 0.0) == 30.0
    assert not w.probation_over("w0", 29.9)
    assert w.probation_over("w0", 30.0)
    assert not w.probation_over("w0", 31.0)  # once
    assert w.suspect("w0", 100.0) == 160.0
    for _ in range(20):
        until = w.suspect("w0", 1000.0)
    assert until == 1000.0 + MAX_SUSPECT_S


def test_a_new_registration_ends_the_suspicion() -> None:
    w = _watch()
    w.suspect("w0", 0.0)
    w.registered("w0", 5.0)
    assert not w.probation_over("w0", 1000.0)
