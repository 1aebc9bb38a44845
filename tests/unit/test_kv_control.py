"""The daemon's program views: cached ones always equal fresh ones, and tools agentd runs
move the acting clock and the tool-time history the KV policy weighs."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from daemon.kv.loop import ProgramViews, _program_view
from daemon.kv.residency import KvResidency
from daemon.state import ProgramState, ProgramStatus, WorkerState
from daemon.workers.protocol import ProgramResidency, WorkerStats
from scheduling.kv import KvView, ProgramView, WorkerView
from scheduling.kv.agentd import AgentdOptions, AgentdPolicy
from scheduling.kv.ledger import Ledger
from scheduling.kv.tool_clock import ToolClocks

S = ProgramStatus
FIELDS = {
    "status": st.sampled_from(list(S)),
    "context_tokens": st.integers(0, 5000),
    "worker_id": st.sampled_from([None, "w0", "w1"]),
    "acting_since": st.sampled_from([None, 1.0, 2.5]),
    "ready_since": st.sampled_from([None, 3.0]),
    "ready_request": st.sampled_from([None, "r1"]),
    "pinned": st.booleans(),
    "pause_marked": st.booleans(),
    "held": st.booleans(),
    "migrate_to": st.sampled_from([None, "w1"]),
    "tool_time_sum": st.sampled_from([0.0, 1.5, 4.0]),
    "tool_time_count": st.integers(0, 3),
    "prefix_group": st.sampled_from([None, "snapshot:t/docs"]),
    "prefix_tokens": st.sampled_from([0, 300]),
}
EDITS = st.lists(st.tuples(st.integers(0, 7), st.sampled_from(sorted(FIELDS)), st.data()),
                 max_size=40)


TOOL_EDITS = {"tool.start": st.sampled_from([0.5, 2.0, 3.0]),
              "tool.end": st.sampled_from([2.6, 4.0, 6.0])}


def fresh(programs: list[ProgramState], clocks: ToolClocks | None = None
          ) -> tuple[ProgramView, ...]:
    return tuple(_program_view(p, clocks.get(p.id) if clocks else None) for p in programs
                 if not p.held and p.status not in (S.STOPPED, S.FAILED))


@settings(max_examples=80, deadline=None)
@given(edits=EDITS)
def test_cached_views_equal_fresh_ones_after_any_edits(
        edits: list[tuple[int, str, st.DataObject]]) -> None:
    programs = [ProgramState(f"p{i}", "s", S.QUEUED, float(i), 0.0) for i in range(8)]
    views = ProgramViews()
    assert views.build(programs) == fresh(programs)
    for index, name, data in edits:
        setattr(programs[index], name, data.draw(FIELDS[name]))
        assert views.build(programs) == fresh(programs)


@settings(max_examples=80, deadline=None)
@given(edits=st.lists(st.tuples(st.integers(0, 3),
                                st.sampled_from(sorted(FIELDS) + sorted(TOOL_EDITS)),
                                st.data()), max_size=40))
def test_cached_views_follow_tool_starts_and_ends(
        edits: list[tuple[int, str, st.DataObject]]) -> None:
    programs = [ProgramState(f"p{i}", "s", S.ACTING, 0.0, 0.0) for i in range(4)]
    clocks = ToolClocks()
    views = ProgramViews(clocks)
    for index, name, data in edits:
        if name == "tool.start":
            clocks.started(programs[index].id, data.draw(TOOL_EDITS[name]))
        elif name == "tool.end":
            clocks.ended(programs[index].id, data.draw(TOOL_EDITS[name]))
        else:
            setattr(programs[index], name, data.draw(FIELDS[name]))
        assert views.build(programs) == fresh(programs, clocks)


def test_unchanged_programs_reuse_their_view_and_gone_ones_are_forgotten() -> None:
    a = ProgramState("a", "s", S.ACTING, 0.0, 0.0, worker_id="w0", context_tokens=10)
    b = ProgramState("b", "s", S.QUEUED, 0.0, 0.0)
    views = ProgramViews()
    first = views.build([a, b])
    a.context_tokens = 20
    second = views.build([a, b])
    assert second[1] is first[1] and second[0] is not first[0]
    assert second[0].context_tokens == 20
    views.forget_gone({"a": a})
    assert views.build([a, b])[1] is not first[1]


def _acting(acting_since: float, **kw: object) -> ProgramState:
    return ProgramState("p", "s", S.ACTING, 0.0, 0.0, worker_id="w0", context_tokens=1000,
                        acting_since=acting_since, **kw)  # type: ignore[arg-type]


def test_a_tool_agentd_runs_starts_the_acting_clock_and_its_duration_is_measured() -> None:
    # The last request ended at 100 and the program had 6 s gaps between requests before.
    p = _acting(100.0, tool_time_sum=12.0, tool_time_count=2)
    clocks = ToolClocks()
    views = ProgramViews(clocks)
    (before,) = views.build([p])
    assert (before.acting_since, before.tool_running) == (100.0, False)
    assert before.tool_time_mean_s == 6.0
    clocks.started("p", 101.5)
    (running,) = views.build([p])
    assert running.acting_since == 101.5 and running.tool_running
    assert running.tool_ended_at is None and running.tool_last_s is None
    assert clocks.ended("p", 104.0) == 2.5
    (done,) = views.build([p])
    assert (done.acting_since, done.tool_running, done.tool_ended_at) == (101.5, False, 104.0)
    assert done.tool_last_s == 2.5
    assert done.tool_time_mean_s == 2.5  # measured durations replace the request gaps


def test_overlapping_calls_are_one_span_and_a_new_request_ends_the_acting_period() -> None:
    p = _acting(10.0)
    clocks = ToolClocks()
    clocks.started("p", 11.0)
    clocks.started("p", 12.0)
    assert clocks.ended("p", 13.0) is None  # the other call still runs
    assert _program_view(p, clocks.get("p")).tool_running
    assert clocks.ended("p", 15.0) == 4.0
    assert clocks.ended("p", 16.0) is None  # an end without a start changes nothing
    p.acting_since = 20.0  # the next request ran and ended
    view = _program_view(p, clocks.get("p"))
    assert view.acting_since == 20.0 and view.tool_ended_at is None
    assert view.tool_last_s == 4.0 and view.tool_time_mean_s == 4.0


def test_a_tool_started_before_the_request_ended_does_not_move_the_clock_back() -> None:
    clocks = ToolClocks()
    clocks.started("p", 5.0)
    view = _program_view(_acting(10.0), clocks.get("p"))
    assert view.acting_since == 10.0 and view.tool_running


def test_measured_tool_time_is_what_the_agentd_policy_holds_a_program_for() -> None:
    """The predicted hold runs from the tool's start for the measured tool time: a program
    whose tools take 3 s is still held 2.5 s into its tool even though its request
    ended 4 s earlier; with request gaps (0.5 s, client think time) its hold is over."""
    clocks = ToolClocks()
    clocks.started("p", 50.0)
    clocks.ended("p", 53.0)
    p = _acting(96.0, tool_time_sum=1.0, tool_time_count=2)
    clocks.started("p", 97.5)
    view = KvView((WorkerView("w0", 4096),), (_program_view(p, clocks.get("p")),))
    policy = AgentdPolicy(AgentdOptions(predicted_hold=True))
    assert policy.held(view.programs[0], view, 100.0)
    gaps_only = KvView(view.workers, (_program_view(p),))
    assert not policy.held(gaps_only.programs[0], gaps_only, 100.0)


def _worker(used: int | None, kv_events: bool = False) -> WorkerState:
    stats = None if used is None else WorkerStats(kv_capacity_tokens=1000, kv_used_tokens=used,
                                                  running=0, waiting=0)
    return WorkerState(id="w0", identity=b"w0", engine="sim", model="m", kv_capacity_tokens=1000,
                       block_size=16, max_batch=8, pid=1, host="h", registered_at=0.0,
                       last_seen=0.0, stats=stats, kv_events=kv_events)


def test_a_paused_programs_view_carries_the_residency_estimate() -> None:
    residency = KvResidency()
    views = ProgramViews(residency=residency)
    paused = ProgramState("p", "s", S.PAUSED, 0.0, 0.0, worker_id="w0", context_tokens=100)
    acting = ProgramState("a", "s", S.ACTING, 0.0, 0.0, worker_id="w0", context_tokens=100)
    assert [v.kv_resident for v in views.build([paused, acting], {"w0": _worker(0)})] == [
        None, None]
    # p's request freed 100 tokens on a 1000-token worker with 400 used: 500 free ahead.
    residency.estimator.request_ended("p", "w0", 100, 0, 0, 400, 1000)
    assert views.build([paused], {"w0": _worker(900)})[0].kv_resident is True
    assert views.build([paused], {"w0": _worker(901)})[0].kv_resident is False  # rebuilt
    assert views.build([paused], {"w0": _worker(None)})[0].kv_resident is None  # no usage
    assert views.build([paused])[0].kv_resident is None  # no worker known
    residency.forget_except({}, {})
    assert views.build([paused], {"w0": _worker(0)})[0].kv_resident is None


def test_the_engines_events_win_over_the_estimate_and_the_estimate_is_the_fallback() -> None:
    residency = KvResidency()
    views = ProgramViews(residency=residency)
    paused = ProgramState("p", "s", S.PAUSED, 0.0, 0.0, worker_id="w0", context_tokens=100)
    residency.estimator.request_ended("p", "w0", 100, 0, 0, 400, 1000)
    worker = _worker(900, kv_events=True)
    # Not reported yet (its request just ended): the estimate answers.
    assert views.build([paused], {"w0": worker})[0].kv_resident is True
    assert residency.source(worker) == "events" and residency.source(_worker(0)) == "estimate"
    worker.residency["p"] = ProgramResidency(96, 32, 32)  # its tail was evicted
    (view,) = views.build([paused], {"w0": worker})
    assert (view.kv_resident, view.kv_cached_tokens) == (False, 32)
    assert view.recompute_at_home() == 68
    worker.residency["p"] = ProgramResidency(96, 80, 80)  # all but one block: resident
    (view,) = views.build([paused], {"w0": worker})
    assert (view.kv_resident, view.kv_cached_tokens) == (True, 80)
    # The ablation reads the estimate only.
    estimate = KvResidency("estimate")
    estimate.estimator.request_ended("p", "w0", 100, 0, 0, 400, 1000)
    assert estimate.of("p", worker) == (True, None)
    # A request of the program ending there makes the report stale until the next one.
    from daemon.state import RequestState
    from daemon.workers.protocol import SamplingParams

    req = RequestState(id="r", program_id="p", session_id="s", kind="completion", model="m",
                       sampling=SamplingParams(), queued_at=0.0, worker_id="w0")
    residency.request_ended(req, worker)
    assert "p" not in worker.residency


def test_a_ready_or_running_request_counts_in_its_programs_context() -> None:
    """A program's first request holds its prompt's KV from dispatch on: a view that said 0
    until the request ended let the agentd policy admit every new program onto one worker
    (found by `agentd replay` on the Mooncake trace: 0.6x vllm-default, imbalance 0.45)."""
    from daemon.state import RequestState
    from daemon.workers.protocol import SamplingParams

    req = RequestState(id="r1", program_id="p", session_id="s", kind="completion", model="m",
                       sampling=SamplingParams(max_tokens=10), queued_at=0.0,
                       prompt_token_ids=list(range(3000)))
    ready = ProgramState(id="p", session_id="s", status=S.QUEUED, created_at=0.0,
                         status_since=0.0, ready_request="r1")
    (view,) = ProgramViews().build([ready], requests={"r1": req})
    assert view.context_tokens == 3000
    running = ProgramState(id="p", session_id="s", status=S.REASONING, created_at=0.0,
                           status_since=0.0, active_request="r1", context_tokens=100)
    req.output_tokens = 40
    (view,) = ProgramViews().build([running], requests={"r1": req})
    assert view.context_tokens == 3040
    (view,) = ProgramViews().build([running])  # no request known: the last one's context
    assert view.context_tokens == 100


def test_programs_opened_from_one_snapshot_hold_its_prefix_once() -> None:
    """Two contexts opened from a 300-token snapshot, each 500 tokens, on one worker: the
    view carries the snapshot as their prefix group, so a ledger that shares prefixes
    books 300 + 200 + 200 tokens, not 1000; a third program outside the group books all."""
    programs = [ProgramState(f"p{i}", "s", S.ACTING, 0.0, 0.0, worker_id="w0",
                             context_tokens=500, prefix_group="snapshot:t/docs",
                             prefix_tokens=300) for i in range(2)]
    lone = ProgramState("lone", "s", S.ACTING, 0.0, 0.0, worker_id="w0", context_tokens=500)
    views = ProgramViews().build([*programs, lone])
    assert [(v.prefix_group, v.prefix_tokens) for v in views] == [
        ("snapshot:t/docs", 300), ("snapshot:t/docs", 300), (None, 0)]
    view = KvView((WorkerView("w0", 4000),), views)
    assert Ledger(view, lambda _: 1.0, share_prefix=True).demand("w0") == 300 + 200 + 200 + 500
    assert Ledger(view, lambda _: 1.0).demand("w0") == 1500  # a policy that shares nothing


def test_every_field_assignment_bumps_the_programs_revision() -> None:
    p = ProgramState("p", "s", S.ACTING, 0.0, 0.0)
    before = p.revision
    p.context_tokens = 5
    p.context_tokens = 5  # the same value again still counts: the cache never guesses
    assert p.revision == before + 2


def test_a_program_replaced_under_its_id_gets_its_own_view() -> None:
    """Two objects with one id and as many assignments each (recovery builds a new one):
    the revision alone would match, so the cache also checks it is the same program."""
    views = ProgramViews()
    old = ProgramState("p", "s", S.ACTING, 0.0, 0.0, context_tokens=10)
    new = ProgramState("p", "s", S.ACTING, 0.0, 0.0, context_tokens=99)
    assert old.revision == new.revision
    assert views.build([old])[0].context_tokens == 10
    assert views.build([new])[0].context_tokens == 99


def test_a_running_requests_tokens_reach_a_cached_view() -> None:
    """The program does not change while its request generates; the view must still."""
    from daemon.state import RequestState
    from daemon.workers.protocol import SamplingParams

    req = RequestState(id="r1", program_id="p", session_id="s", kind="completion", model="m",
                       sampling=SamplingParams(max_tokens=10), queued_at=0.0,
                       prompt_token_ids=list(range(100)))
    p = ProgramState(id="p", session_id="s", status=S.REASONING, created_at=0.0,
                     status_since=0.0, active_request="r1")
    views = ProgramViews()
    assert views.build([p], requests={"r1": req})[0].context_tokens == 100
    req.output_tokens = 7
    assert views.build([p], requests={"r1": req})[0].context_tokens == 107
