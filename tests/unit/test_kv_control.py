"""The daemon's cached program views always equal freshly built ones."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from daemon.kv_control import ProgramViews, _program_view
from daemon.state import ProgramState, ProgramStatus
from scheduling.kv import ProgramView

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
}
EDITS = st.lists(st.tuples(st.integers(0, 7), st.sampled_from(sorted(FIELDS)), st.data()),
                 max_size=40)


def fresh(programs: list[ProgramState]) -> tuple[ProgramView, ...]:
    return tuple(_program_view(p) for p in programs
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
