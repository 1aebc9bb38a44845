"""Clamping worker-reported token counts at the protocol boundary."""

from __future__ import annotations

from daemon.metrics import DaemonMetrics
from daemon.workers import protocol
from daemon.workers.counts import (
    ProtocolTallies,
    clean_delta,
    clean_finish,
    clean_residency,
    clean_stats,
    register_problem,
)


def _delta(**kw: object) -> protocol.TokenDelta:
    return protocol.TokenDelta(**{"request_id": "r", "text": "t", "num_tokens": 1, **kw})  # type: ignore[arg-type]


def _finish(**kw: object) -> protocol.Finish:
    values = {"request_id": "r", "reason": "stop", "prompt_tokens": 10, "cached_tokens": 4,
              "output_tokens": 3, "ttft_s": 0.1, **kw}
    return protocol.Finish(**values)  # type: ignore[arg-type]


def test_sane_messages_pass_untouched() -> None:
    delta = _delta(prompt_tokens=10, cached_tokens=4)
    assert clean_delta(delta, 0, 16) == (delta, [])
    finish = _finish()
    assert clean_finish(finish, 3) == (finish, [])
    stats = protocol.WorkerStats(kv_capacity_tokens=100, kv_used_tokens=100, running=1,
                                 waiting=0, steps=5)
    assert clean_stats(stats) == (stats, [])


def test_a_delta_with_impossible_counts_is_clamped() -> None:
    out, problems = clean_delta(_delta(num_tokens=-5, prompt_tokens=-1, cached_tokens=-9), 0, 4)
    assert (out.num_tokens, out.prompt_tokens, out.cached_tokens) == (0, 0, 0)
    assert len(problems) == 3
    out, problems = clean_delta(_delta(prompt_tokens=10, cached_tokens=11), 0, 4)
    assert out.cached_tokens == 10 and problems == ["cached_tokens 11 > prompt_tokens 10"]


def test_output_never_passes_max_tokens() -> None:
    out, problems = clean_delta(_delta(num_tokens=10**9), 3, 4)
    assert out.num_tokens == 1 and problems
    out, _ = clean_delta(_delta(num_tokens=1), 4, 4)
    assert out.num_tokens == 0


def test_a_finish_is_clamped_and_checked_against_the_deltas() -> None:
    out, problems = clean_finish(
        _finish(prompt_tokens=-3, cached_tokens=10**12, output_tokens=-7, ttft_s=-1.0), 0)
    assert (out.prompt_tokens, out.cached_tokens, out.output_tokens, out.ttft_s) == (
        0, 0, 0, None)
    assert len(problems) == 4
    out, problems = clean_finish(_finish(output_tokens=9), 3)
    assert out.output_tokens == 3 and problems == ["output_tokens 9 != 3 sent as deltas"]
    assert clean_finish(_finish(ttft_s=float("nan")), 3)[0].ttft_s is None


def test_stats_are_clamped() -> None:
    stats = protocol.WorkerStats(kv_capacity_tokens=100, kv_used_tokens=500, running=-1,
                                 waiting=0, prefix_cache_hits=-4)
    out, problems = clean_stats(stats)
    assert (out.kv_used_tokens, out.running, out.prefix_cache_hits) == (100, 0, 0)
    assert len(problems) == 3


def test_negative_sizes_are_a_registration_problem() -> None:
    reg = protocol.Register(worker_id="w", engine="sim", model="m", kv_capacity_tokens=0,
                            block_size=0, max_batch=0, schema_hash="h")
    assert register_problem(reg) is None
    bad = protocol.Register(worker_id="w", engine="sim", model="m", kv_capacity_tokens=1,
                            block_size=16, max_batch=-1, schema_hash="h")
    assert register_problem(bad) == "max_batch must be >= 0, got -1"


def test_tallies_log_once_count_always_and_render() -> None:
    t = ProtocolTallies()
    assert t.bad("w0", "finish", ["x"]) is True
    assert t.bad("w0", "finish", ["x"]) is False
    assert t.refuse(b"a", "key", 0.0) is True
    assert t.refuse(b"a", "key", 1.0) is False
    # Many identities: at most a few log lines a minute, every one counted.
    logged = sum(t.refuse(f"id{i}".encode(), "key", 2.0) for i in range(100))
    assert logged == 19 and t.refused["key"] == 102
    assert t.refuse(b"late", "key", 61.0) is True
    t.stalls["w0"] += 2
    metrics = DaemonMetrics()
    metrics.add(t.families)
    rendered = metrics.render().decode()
    assert 'agentd_worker_bad_counts_total{worker="w0"} 2' in rendered
    assert 'agentd_request_stalls_total{worker="w0"} 2' in rendered
    assert 'agentd_worker_registrations_refused_total{reason="key"} 103' in rendered


def test_residency_entries_out_of_range_are_dropped() -> None:
    ok = protocol.ProgramResidency(256, 128, 192)
    report = {"a": ok, "b": protocol.ProgramResidency(64, 96, 96),  # cached past its context
              "c": protocol.ProgramResidency(64, -1, 0),
              "d": protocol.ProgramResidency(10_000, 9_000, 9_000)}  # more than the worker holds
    kept, problems = clean_residency(report, capacity_tokens=4096)
    assert kept == {"a": ok} and len(problems) == 1 and "3 programs" in problems[0]
    assert clean_residency({"a": ok}, 4096) == ({"a": ok}, [])
