"""Scheduler steps: prefix reuse, preemption, chunked prefill, abort, counters."""

from __future__ import annotations

from typing import Any

import pytest

from daemon.engines.sim.cost import CostModel
from daemon.engines.sim.scheduler import (
    RequestRejected,
    SchedulerConfig,
    SimRequest,
    SimScheduler,
    Status,
)
from daemon.engines.sim.tokenizer import filler_token_id

COST = CostModel(name="t", c0=0.01, c_prefill=1e-4, c_decode=1e-3, c_attn=1e-6)


def make(num_blocks: int = 64, block_size: int = 4, **kw: Any) -> SimScheduler:
    cfg = SchedulerConfig(block_size=block_size, num_blocks=num_blocks, **kw)
    return SimScheduler(cfg, COST)


def req(rid: str, prompt: list[int], max_tokens: int = 1) -> SimRequest:
    return SimRequest(request_id=rid, prompt_token_ids=prompt, max_tokens=max_tokens)


def drain(s: SimScheduler) -> None:
    while s.has_work():
        s.step()


def test_extending_a_resident_prefix_hits_its_full_blocks() -> None:
    s = make()
    base = list(range(1000, 1010))  # 10 tokens: 2 full blocks of 4
    s.add_request(req("a", base, max_tokens=1))
    drain(s)
    s.add_request(req("b", [*base, 7, 8, 9, 10, 11]))
    out = s.step().outputs[0]
    assert out.num_cached_tokens == 8
    assert out.num_scheduled_tokens == 15 - 8
    st = s.stats()
    assert (st.prefix_cache_queries, st.prefix_cache_hits) == (10 + 15, 8)
    s.kv.pool.check()


def test_next_turn_reuses_decode_blocks() -> None:
    s = make()
    a = req("a", list(range(1000, 1006)), max_tokens=7)
    s.add_request(a)
    drain(s)
    # 6 prompt + 7 output tokens, the last never computed: 12 computed = 3 full blocks.
    assert a.output_token_ids == [filler_token_id(i) for i in range(7)]
    s.add_request(req("b", [*a.all_token_ids, 5, 6, 7]))
    assert s.step().outputs[0].num_cached_tokens == 12


def test_preemption_exactly_when_blocks_run_out_and_recompute_reuses_prefix() -> None:
    # 4 blocks of 4 tokens. Two 4-token prompts: each holds 2 blocks once its 5th token is
    # computed, and asks for a 3rd at its 9th token.
    s = make(num_blocks=4)
    a, b = req("a", list(range(100, 104)), max_tokens=6), req("b", list(range(200, 204)), 9)
    s.add_request(a)
    s.add_request(b)
    s.step()
    s.step()
    assert s.kv.pool.num_free == 0
    for _ in range(3):  # blocks are exhausted but nobody needs a new one yet
        result = s.step()
        assert result.preempted == ()
        assert {o.request_id for o in result.outputs} == {"a", "b"}
    assert s.stats().preemptions == 0
    result = s.step()  # "a" computes its 9th token: a block is needed, none is free
    assert result.preempted == ("b",)
    assert [o.request_id for o in result.outputs] == ["a"]
    assert result.outputs[0].finish_reason == "length"  # a's 6th output
    assert b.status is Status.PREEMPTED and list(s.waiting) == [b]
    assert b.num_computed_tokens == 0 and b.num_output_tokens == 5
    # "a" took b's tail block (freed first, so evicted first); b's first block is still cached.
    result = s.step()
    (out,) = result.outputs
    assert out.request_id == "b" and out.num_scheduled_tokens == 9 - 4
    assert out.new_token_ids == (filler_token_id(5),)  # recompute resumes, no repeated token
    assert out.num_cached_tokens == 0  # as first admitted; the re-admission hit is a counter
    st = s.stats()
    assert st.preemptions == 1
    assert (st.prefix_cache_queries, st.prefix_cache_hits) == (4 + 4 + 9, 4)
    drain(s)
    assert b.output_token_ids == [filler_token_id(i) for i in range(9)]
    s.kv.pool.check()


def test_newest_running_request_is_the_victim() -> None:
    s = make(num_blocks=6)
    reqs = [req(r, list(range(10 * i, 10 * i + 4)), max_tokens=12) for i, r in enumerate("xyz")]
    for r in reqs:
        s.add_request(r)
    while not s.num_preemptions:
        s.step()
    assert reqs[2].status is Status.PREEMPTED
    assert reqs[0].status is reqs[1].status is Status.RUNNING


def test_chunked_prefill_respects_the_token_budget() -> None:
    s = make(num_blocks=256, max_num_batched_tokens=32)
    s.add_request(req("d", [1, 2, 3], max_tokens=50))
    s.step()
    s.add_request(req("long", list(range(500, 600)), max_tokens=2))
    chunks = []
    while True:
        result = s.step()
        assert sum(o.num_scheduled_tokens for o in result.outputs) <= 32
        assert result.num_decode_seqs == 1  # the decode keeps running alongside the chunks
        (long_out,) = [o for o in result.outputs if o.request_id == "long"]
        chunks.append(long_out.num_scheduled_tokens)
        if long_out.new_token_ids:
            break
        assert result.num_prefill_tokens == 31
    assert chunks == [31, 31, 31, 7]


def test_without_chunked_prefill_a_long_prompt_waits_for_a_whole_budget() -> None:
    s = make(num_blocks=256, max_num_batched_tokens=32, enable_chunked_prefill=False)
    s.add_request(req("d", [1, 2, 3], max_tokens=5))
    s.add_request(req("long", list(range(500, 532)), max_tokens=1))
    first = s.step()
    assert [o.request_id for o in first.outputs] == ["d"]  # 3 + 32 > 32: "long" waits
    s.step()
    drain(s)
    assert s.stats().generated_tokens == 6


def test_max_num_seqs_caps_the_running_set() -> None:
    s = make(max_num_seqs=2)
    for i in range(3):
        s.add_request(req(f"r{i}", [i, i + 1], max_tokens=3))
    s.step()
    assert len(s.running) == 2 and len(s.waiting) == 1


def test_abort_frees_blocks_and_keeps_them_cached() -> None:
    s = make(num_blocks=16, max_num_seqs=1)
    s.add_request(req("a", list(range(9)), max_tokens=20))
    s.add_request(req("w", [1]))
    s.step()
    assert s.kv.pool.num_used == 3
    aborted = s.abort("a")
    assert aborted is not None and aborted.finish_reason == "abort"
    assert s.kv.pool.num_used == 0 and len(s.kv.pool.cached) == 2
    assert s.abort("a") is None
    assert s.waiting[0].request_id == "w" and s.abort("w") is not None
    assert not s.has_work() and s.stats().running == 0
    s.kv.pool.check()


def test_counters_and_kv_usage() -> None:
    s = make(num_blocks=32, block_size=4)
    s.add_request(req("a", list(range(6)), max_tokens=3))
    s.add_request(req("b", list(range(6)), max_tokens=2))
    s.step()
    st = s.stats()
    assert (st.running, st.waiting, st.steps, st.generated_tokens) == (2, 0, 1, 2)
    # As in vLLM, a's blocks enter the prefix map when allocated, so b, admitted later in the
    # same step, already shares a's first full block: 2 + 1 blocks in use.
    assert st.prefix_cache_hits == 4
    assert st.kv_used_tokens == 3 * 4 and st.kv_capacity_tokens == 128
    drain(s)
    st = s.stats()
    assert (st.running, st.waiting, st.steps, st.generated_tokens) == (0, 0, 3, 5)
    assert st.kv_used_tokens == 0 and st.prefix_cache_queries == 12


def test_rejects_what_can_never_run() -> None:
    s = make(num_blocks=4)
    with pytest.raises(RequestRejected):
        s.add_request(req("big", list(range(16))))
    with pytest.raises(RequestRejected):
        s.add_request(req("empty", []))
    s.add_request(req("ok", [1]))
    with pytest.raises(RequestRejected):
        s.add_request(req("ok", [1]))


def test_length_stop_at_max_model_len() -> None:
    s = make(num_blocks=4)  # model_len = 16 tokens
    r = req("r", list(range(10)), max_tokens=100)
    s.add_request(r)
    drain(s)
    assert r.finish_reason == "length" and r.num_tokens == 16


def test_simulated_eos_stops_early() -> None:
    s = make()
    r = SimRequest(request_id="e", prompt_token_ids=[1, 2], max_tokens=10, eos_after=3)
    s.add_request(r)
    drain(s)
    assert (r.finish_reason, r.num_output_tokens) == ("stop", 3)
