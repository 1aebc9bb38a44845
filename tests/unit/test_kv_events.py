"""Residency from KV cache events: the mirror follows stores, evictions and clears; the sim
engine publishes the events vLLM does; vLLM's own payloads decode."""

from __future__ import annotations

import random

import msgspec
import pytest

from daemon.engines.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventBatch,
    Residency,
    decode_batch,
)
from daemon.engines.sim.cost import CostModel
from daemon.engines.sim.scheduler import SchedulerConfig, SimRequest, SimScheduler

COST = CostModel(name="t", c0=0.01, c_prefill=1e-4, c_decode=1e-3, c_attn=1e-6)
BS = 4


def stored(hashes: list[bytes], tokens: list[int], parent: bytes | None = None,
           medium: str = "GPU") -> BlockStored:
    return BlockStored(block_hashes=list[bytes | int](hashes), parent_block_hash=parent,
                       token_ids=tokens, block_size=BS, medium=medium)


def test_a_programs_context_is_cached_as_far_as_its_blocks_are_stored() -> None:
    r = Residency(BS)
    tokens = list(range(10))  # two full blocks and a partial one
    r.apply(stored([b"a", b"b"], tokens[:8]))
    r.remember("p", tokens)
    report, dropped = r.take_report()
    assert (report["p"].context_tokens, report["p"].cached_tokens) == (8, 8) and not dropped
    assert r.take_report() == ({}, [])  # nothing changed since
    r.apply(BlockRemoved(block_hashes=[b"b"], medium="GPU"))  # the tail goes first
    assert r.take_report()[0]["p"].cached_tokens == 4
    r.apply(stored([b"b2"], tokens[4:8], parent=b"a"))  # recomputed under another hash
    assert r.take_report()[0]["p"].cached_tokens == 8


def test_blocks_published_after_the_request_ended_still_count() -> None:
    """vLLM publishes from its engine process: the Finish may come before the events."""
    r = Residency(BS)
    r.remember("p", list(range(8)))
    assert r.take_report()[0]["p"].cached_tokens == 0
    r.apply(stored([b"a", b"b"], list(range(8))))
    assert r.take_report()[0]["p"].cached_tokens == 8


def test_an_evicted_program_is_reported_cold_once_and_then_dropped() -> None:
    r = Residency(BS)
    r.apply(stored([b"a"], [1, 2, 3, 4]))
    r.remember("p", [1, 2, 3, 4, 5])
    r.take_report()
    r.apply(BlockRemoved(block_hashes=[b"a"], medium="GPU"))
    report, _ = r.take_report()
    assert report["p"].cached_tokens == 0 and r.of("p") is None
    assert r.take_report(everything=True) == ({}, [])


def test_a_shared_prefix_serves_every_program_holding_it() -> None:
    r = Residency(BS)
    system = [9, 9, 9, 9]
    r.apply(stored([b"s", b"x"], [*system, 1, 1, 1, 1]))
    r.apply(stored([b"y"], [2, 2, 2, 2], parent=b"s"))
    r.remember("x", [*system, 1, 1, 1, 1])
    r.remember("y", [*system, 2, 2, 2, 2])
    r.apply(BlockRemoved(block_hashes=[b"s"], medium="GPU"))
    report, _ = r.take_report()
    assert report["x"].cached_tokens == report["y"].cached_tokens == 0


def test_a_lower_tier_keeps_blocks_reachable_and_a_clear_drops_only_the_engines_cache() -> None:
    r = Residency(BS)
    tokens = list(range(8))
    r.apply(stored([b"a", b"b"], tokens))
    r.apply(stored([b"a", b"b"], tokens, medium="CPU"))  # offloaded to host memory
    r.remember("p", tokens)
    r.apply(BlockRemoved(block_hashes=[b"b"], medium="GPU"))
    report, _ = r.take_report()
    assert (report["p"].cached_tokens, report["p"].reachable_tokens) == (4, 8)
    r.apply(AllBlocksCleared())
    report, _ = r.take_report()
    assert (report["p"].cached_tokens, report["p"].reachable_tokens) == (0, 8)


def test_a_block_whose_parent_was_never_seen_is_not_guessed() -> None:
    r = Residency(BS)
    r.apply(stored([b"b"], [5, 6, 7, 8], parent=b"unknown"))
    r.remember("p", [1, 2, 3, 4, 5, 6, 7, 8])
    assert r.of("p") is not None and r.of("p").cached_tokens == 0  # type: ignore[union-attr]


def test_the_oldest_program_is_dropped_past_the_cap_and_reported_so() -> None:
    r = Residency(BS, max_programs=2)
    for pid in ("a", "b", "c"):
        r.remember(pid, [1, 2, 3, 4])
    report, dropped = r.take_report()
    assert sorted(report) == ["b", "c"] and dropped == ["a"]


def test_vllm_payloads_decode_with_unknown_fields_ignored() -> None:
    """The wire shape of vLLM's KVEventBatch (array-like batch, tagged events with fields
    agentd does not read); checked against vLLM's own classes in the vLLM tests."""
    raw = msgspec.msgpack.encode([1.5, [
        {"type": "BlockStored", "block_hashes": [b"\x01"], "parent_block_hash": None,
         "token_ids": [1, 2, 3, 4], "block_size": 4, "lora_id": None, "medium": "GPU",
         "lora_name": None, "group_idx": 0},
        {"type": "BlockRemoved", "block_hashes": [7], "medium": "GPU"},
        {"type": "AllBlocksCleared"}], 0])
    batch = decode_batch(raw)
    assert isinstance(batch, EventBatch) and batch.ts == 1.5
    assert [type(e).__name__ for e in batch.events] == [
        "BlockStored", "BlockRemoved", "AllBlocksCleared"]


@pytest.mark.vllm
def test_vllms_own_event_batch_decodes() -> None:
    from vllm.distributed.kv_events import BlockRemoved as VBlockRemoved
    from vllm.distributed.kv_events import BlockStored as VBlockStored
    from vllm.distributed.kv_events import KVEventBatch

    batch = KVEventBatch(ts=2.0, events=[
        VBlockStored(block_hashes=[b"h1", b"h2"], parent_block_hash=None,
                     token_ids=list(range(8)), block_size=4, lora_id=None, medium="GPU",
                     lora_name=None),
        VBlockRemoved(block_hashes=[b"h2"], medium="GPU")])
    r = Residency(4)
    r.apply_all(decode_batch(msgspec.msgpack.encode(batch)).events)
    r.remember("p", list(range(8)))
    assert r.of("p") is not None and r.of("p").cached_tokens == 4  # type: ignore[union-attr]


def _sim(num_blocks: int) -> SimScheduler:
    return SimScheduler(SchedulerConfig(block_size=BS, num_blocks=num_blocks), COST)


def _run(s: SimScheduler, rid: str, program: str, prompt: list[int], out: int = 3) -> SimRequest:
    r = SimRequest(request_id=rid, prompt_token_ids=prompt, max_tokens=out, program_id=program)
    s.add_request(r)
    while s.has_work():
        s.step()
    return r


def test_the_sim_engines_events_give_what_its_next_request_finds_cached() -> None:
    """The property the daemon relies on: the residency reported for a paused program is
    what its next request finds in the cache (within one block), under random pressure."""
    rng = random.Random(7)
    s = _sim(num_blocks=40)  # 160 tokens: a few programs' contexts
    contexts: dict[str, list[int]] = {}
    for step in range(300):
        pid = f"p{rng.randrange(8)}"
        context = contexts.get(pid, [1000 * int(pid[1:]) + i for i in range(rng.randrange(5, 30))])
        prompt = [*context, *[rng.randrange(50_000) for _ in range(rng.randrange(1, 12))]]
        if len(prompt) > 120:
            prompt = prompt[:20]
        reported = s.residency.of(pid)
        s.residency.take_report()
        req = _run(s, f"r{step}", pid, prompt)
        contexts[pid] = req.all_token_ids
        if reported is not None:
            expected = min(reported.cached_tokens, (len(prompt) - 1) // BS * BS)
            assert abs(req.num_cached_tokens - expected) <= BS, (step, pid)
    s.kv.pool.check()


def test_a_host_tier_keeps_evicted_blocks_loadable_and_reported_reachable() -> None:
    """Like vLLM's CPU offloading: a program's blocks evicted from the pool go to host memory,
    its residency says reachable (not cached), and its next request loads them back instead
    of prefilling them, paying the transfer."""
    s = SimScheduler(SchedulerConfig(block_size=BS, num_blocks=12, host_kv_blocks=64), COST)
    a = _run(s, "a0", "a", list(range(100, 124)), out=2)  # 24 prompt tokens: 6 blocks
    s.residency.take_report()
    for n in range(3):  # others' prompts evict a's blocks from the 12-block pool
        _run(s, f"b{n}", f"b{n}", [9000 + 100 * n + i for i in range(40)], out=1)
    report = s.residency.of("a")
    assert report is not None and report.cached_tokens == 0
    assert report.reachable_tokens == report.context_tokens == 24
    before = s.num_loaded_tokens
    nxt = _run(s, "a1", "a", [*a.all_token_ids, 1, 2, 3], out=1)
    assert nxt.num_cached_tokens == 24 and s.num_loaded_tokens - before == 24
    s.kv.pool.check()


def test_without_a_host_tier_evicted_blocks_are_recomputed() -> None:
    s = SimScheduler(SchedulerConfig(block_size=BS, num_blocks=12), COST)
    a = _run(s, "a0", "a", list(range(100, 124)), out=2)
    for n in range(3):
        _run(s, f"b{n}", f"b{n}", [9000 + 100 * n + i for i in range(40)], out=1)
    report = s.residency.of("a")
    assert report is not None and report.reachable_tokens == 0
    assert _run(s, "a1", "a", [*a.all_token_ids, 1, 2, 3], out=1).num_cached_tokens == 0
