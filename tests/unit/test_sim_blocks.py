"""Block pool: LRU free queue, prefix map, ref counts."""

from __future__ import annotations

from daemon.engines.sim.blocks import BlockPool, KVCacheManager, block_hash
from daemon.engines.sim.scheduler import SimRequest


def test_eviction_is_lru_among_free_blocks() -> None:
    pool = BlockPool(num_blocks=4, block_size=4)
    a, b, c, d = pool.allocate(4)
    for blk, h in ((a, 11), (b, 12), (c, 13), (d, 14)):
        pool.cache(blk, h)
    pool.free([c])
    pool.free([a])
    pool.free([d])
    assert pool.free_order() == [c.block_id, a.block_id, d.block_id]
    # A cache hit on a free block takes it out of the queue; freeing it again makes it newest.
    pool.touch([c])
    pool.free([c])
    assert pool.free_order() == [a.block_id, d.block_id, c.block_id]
    (first,) = pool.allocate(1)
    assert first is a and a.block_hash is None and 11 not in pool.cached
    assert pool.evictions == 1
    # The block still in use and the free ones not yet reused keep their hashes.
    assert set(pool.cached) == {12, 13, 14}
    pool.check()


def test_shared_block_is_free_only_when_last_reference_drops() -> None:
    pool = BlockPool(num_blocks=2, block_size=4)
    (blk,) = pool.allocate(1)
    pool.cache(blk, 7)
    pool.touch([blk])
    assert blk.ref_cnt == 2
    pool.free([blk])
    assert pool.num_free == 1
    pool.free([blk])
    assert pool.num_free == 2 and pool.cached[7] is blk
    pool.check()


def test_block_hash_chains_on_parent() -> None:
    toks = [1, 2, 3, 4]
    assert block_hash(0, toks) == block_hash(0, list(toks))
    assert block_hash(0, toks) != block_hash(1, toks)


def test_lookup_stops_at_first_missing_block_and_leaves_one_token() -> None:
    kv = KVCacheManager(num_blocks=8, block_size=4)
    first = SimRequest(request_id="a", prompt_token_ids=list(range(100, 112)), max_tokens=1)
    assert kv.get_computed_blocks(first) == []
    assert kv.allocate_slots(first, 12)
    kv.free(first)
    # Same 12 tokens again: only 2 of the 3 full blocks count, the last token must be computed.
    again = SimRequest(request_id="b", prompt_token_ids=list(range(100, 112)), max_tokens=1)
    assert len(kv.get_computed_blocks(again)) == 2
    # Diverging inside block 1: only block 0 matches.
    fork = SimRequest(
        request_id="c", prompt_token_ids=[*range(100, 105), 999, *range(106, 120)], max_tokens=1
    )
    assert len(kv.get_computed_blocks(fork)) == 1
    assert kv.queries == 12 + 12 + 20 and kv.hits == 8 + 4
    kv.pool.check()


def test_allocation_fails_without_side_effects_when_short() -> None:
    kv = KVCacheManager(num_blocks=3, block_size=4)
    big = SimRequest(request_id="big", prompt_token_ids=list(range(13)), max_tokens=1)
    assert not kv.allocate_slots(big, 13)
    assert kv.pool.num_free == 3 and "big" not in kv.req_blocks
    kv.pool.check()
