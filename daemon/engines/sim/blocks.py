"""Paged KV blocks with prefix caching, modelled on vLLM v1's block pool and KV cache manager.

A full block is named by ``hash((parent_hash, token_ids_of_the_block))`` (``block_hash``, the
content key daemon/engines/kv_events.py names blocks by): stable across processes, and far
cheaper than a cryptographic digest on the per-step path.

``BlockPool`` owns the blocks; ``KVCacheManager`` maps requests onto them (lookup of cached
prefixes, slot allocation, freeing). Every operation is O(blocks touched): the free list is an
``OrderedDict`` used as an intrusive LRU queue, so removal from the middle (a cache hit on a
free block) and pop from the front (eviction) are both O(1).

Like vLLM with `KVEventsConfig`, the pool records which blocks enter and leave the prefix map
(``events``: ``BlockStored`` / ``BlockRemoved``, daemon/engines/kv_events.py) for whoever
drains them; the daemon learns residency from them.

A ``HostTier`` models vLLM's CPU offloading (`kv_offloading_size` on a GPU build): a block
evicted from the pool is kept in host memory (an LRU of its hash, medium "CPU" in the
events), and a later request loads a run of them back instead of recomputing it, paying the
transfer (``SchedulerConfig.host_load_s_per_token``) rather than the prefill.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import Protocol

from daemon.engines.kv_events import (
    ROOT_HASH,
    BlockRemoved,
    BlockStored,
    KvEvent,
    block_hash,
)

__all__ = ["ROOT_HASH", "BlockPool", "KVBlock", "KVCacheManager", "block_hash"]


class KVBlock:
    __slots__ = ("block_hash", "block_id", "ref_cnt")

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_cnt = 0
        self.block_hash: int | None = None

    def __repr__(self) -> str:
        return f"KVBlock({self.block_id}, ref={self.ref_cnt}, hash={self.block_hash})"


class BlockPool:
    """A fixed set of KV blocks, a hash → block prefix map, and an LRU free queue.

    Invariants (``check()`` asserts them; tests call it):
    - every block is either in use (``ref_cnt > 0``) or in the free queue (``ref_cnt == 0``),
      never both; ``num_free + in-use blocks == num_blocks``;
    - ``cached[h] is b`` iff ``b.block_hash == h``: a block carrying a hash is reachable from the
      prefix map, whether it is in use or free; a hash maps to one block (first writer wins when
      two requests fill identical blocks at once, the second copy stays anonymous);
    - the free queue is in eviction order: front = freed longest ago. A free block keeps its hash
      (its contents stay reusable) until it is popped for a new allocation, which evicts it.
    """

    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError("num_blocks and block_size must be positive")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.blocks = [KVBlock(i) for i in range(num_blocks)]
        self._free: OrderedDict[int, KVBlock] = OrderedDict((b.block_id, b) for b in self.blocks)
        self.cached: dict[int, KVBlock] = {}
        self.evictions = 0
        # Cache events since the owner last drained them (None: not recorded).
        self.events: list[KvEvent] | None = None
        self.host: HostTier | None = None  # where evicted blocks go, if anywhere

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self._free)

    def free_order(self) -> list[int]:
        """Block ids in the order they would be evicted (for tests and debugging)."""
        return list(self._free)

    def lookup_chain(self, hashes: Sequence[int], max_blocks: int) -> list[KVBlock]:
        """The longest run of resident blocks matching ``hashes[0:]``, at most ``max_blocks``."""
        hits: list[KVBlock] = []
        cached = self.cached
        for h in hashes[:max_blocks]:
            block = cached.get(h)
            if block is None:
                break
            hits.append(block)
        return hits

    def touch(self, blocks: Iterable[KVBlock]) -> None:
        """Take a reference on cached blocks, pulling free ones out of the eviction queue."""
        for b in blocks:
            if b.ref_cnt == 0:
                del self._free[b.block_id]
            b.ref_cnt += 1

    def allocate(self, n: int) -> list[KVBlock]:
        """Pop ``n`` blocks from the LRU front; a popped block that still had a hash is evicted."""
        if n > len(self._free):
            raise RuntimeError(f"asked for {n} blocks with {len(self._free)} free")
        out: list[KVBlock] = []
        evicted: list[int] = []
        for _ in range(n):
            _, b = self._free.popitem(last=False)
            if b.block_hash is not None:
                del self.cached[b.block_hash]
                evicted.append(b.block_hash)
                b.block_hash = None
                self.evictions += 1
            b.ref_cnt = 1
            out.append(b)
        if evicted:
            if self.host is not None:  # stored there before they leave here, as vLLM does
                self.host.store(evicted, self.events)
            if self.events is not None:
                self.events.append(BlockRemoved(block_hashes=list[int | bytes](evicted),
                                                medium="GPU"))
        return out

    def cache(self, block: KVBlock, h: int) -> bool:
        """Name the block `h` in the prefix map; False when another block already is."""
        if block.block_hash is None and h not in self.cached:
            block.block_hash = h
            self.cached[h] = block
            return True
        return False

    def stored(self, parent: int | None, hashes: list[int], tokens: list[int]) -> None:
        """Record that the blocks `hashes` (with `tokens`, in order, after `parent`) were
        cached, as vLLM's BlockStored does."""
        if hashes and self.events is not None:
            self.events.append(BlockStored(
                block_hashes=list(hashes), parent_block_hash=parent, token_ids=tokens,
                block_size=self.block_size, medium="GPU"))

    def free(self, blocks: Iterable[KVBlock]) -> None:
        """Drop one reference each; blocks reaching zero join the queue tail in the given order."""
        for b in blocks:
            b.ref_cnt -= 1
            if b.ref_cnt == 0:
                self._free[b.block_id] = b

    def check(self) -> None:
        in_use = sum(1 for b in self.blocks if b.ref_cnt > 0)
        assert in_use + len(self._free) == self.num_blocks
        assert all(b.ref_cnt == 0 for b in self._free.values())
        assert all(b.ref_cnt >= 0 for b in self.blocks)
        assert all(b.block_hash == h for h, b in self.cached.items())
        hashed = [b for b in self.blocks if b.block_hash is not None]
        assert len(hashed) == len(self.cached)


class HostTier:
    """Blocks kept in host memory after their eviction from the pool: an LRU of hashes."""

    def __init__(self, num_blocks: int) -> None:
        if num_blocks <= 0:
            raise ValueError("a host tier needs at least one block")
        self.num_blocks = num_blocks
        self._lru: OrderedDict[int, None] = OrderedDict()
        self.loaded_blocks = 0

    def __contains__(self, h: int) -> bool:
        return h in self._lru

    def store(self, hashes: list[int], events: list[KvEvent] | None) -> None:
        dropped: list[int | bytes] = []
        stored: list[int | bytes] = []
        for h in hashes:
            if h in self._lru:
                self._lru.move_to_end(h)
                continue
            self._lru[h] = None
            stored.append(h)
            if len(self._lru) > self.num_blocks:
                dropped.append(self._lru.popitem(last=False)[0])
        if events is not None:
            if stored:  # named by the hash the pool published: no tokens needed
                events.append(BlockStored(block_hashes=stored, parent_block_hash=None,
                                          token_ids=[], block_size=0, medium="CPU"))
            if dropped:
                events.append(BlockRemoved(block_hashes=dropped, medium="CPU"))

    def run(self, hashes: Sequence[int]) -> int:
        """How many of `hashes`, from the first, are held here."""
        n = 0
        for h in hashes:
            if h not in self._lru:
                break
            self._lru.move_to_end(h)
            n += 1
        return n


class KVRequest(Protocol):
    """What the KV manager needs of a request (``SimRequest`` provides it)."""

    request_id: str
    all_token_ids: list[int]
    block_hashes: list[int]
    num_computed_tokens: int


class KVCacheManager:
    """Maps requests onto the block pool, as vLLM v1's ``KVCacheManager`` does.

    Counters are vLLM's prefix-cache stats in tokens: every lookup (a new request, or one
    re-admitted after preemption) adds its token count to ``queries`` and its cached tokens to
    ``hits``.
    """

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True,
                 host_blocks: int = 0):
        self.pool = BlockPool(num_blocks, block_size)
        if host_blocks:
            self.pool.host = HostTier(host_blocks)
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.req_blocks: dict[str, list[KVBlock]] = {}
        # How many leading blocks of each request have been offered to the prefix map.
        self._num_cached_blocks: dict[str, int] = {}
        self.queries = 0
        self.hits = 0

    def _extend_hashes(self, req: KVRequest, num_full_blocks: int) -> None:
        hashes = req.block_hashes
        bs = self.block_size
        tokens = req.all_token_ids
        parent = hashes[-1] if hashes else ROOT_HASH
        for i in range(len(hashes), num_full_blocks):
            parent = block_hash(parent, tokens[i * bs : (i + 1) * bs])
            hashes.append(parent)

    def get_computed_blocks(self, req: KVRequest) -> list[KVBlock]:
        """Resident blocks holding the longest cached prefix of the request's tokens.

        At least one token is always left to compute, because the model must run on the last
        token to produce the next one; so a fully cached prompt hits one block short.
        """
        num_tokens = len(req.all_token_ids)
        self.queries += num_tokens
        if not self.enable_prefix_caching:
            return []
        max_blocks = (num_tokens - 1) // self.block_size
        self._extend_hashes(req, max_blocks)
        hits = self.pool.lookup_chain(req.block_hashes, max_blocks)
        self.hits += len(hits) * self.block_size
        return hits

    def host_run(self, req: KVRequest, start: int) -> int:
        """Blocks of the request's prefix after its first `start` (the pool's hits) that the
        host tier holds: loaded instead of recomputed. Same one-token rule as the pool's."""
        host = self.pool.host
        if host is None or not self.enable_prefix_caching:
            return 0
        max_blocks = (len(req.all_token_ids) - 1) // self.block_size
        return host.run(req.block_hashes[start:max_blocks])

    def allocate_slots(
        self, req: KVRequest, num_new_tokens: int, computed: Sequence[KVBlock] = ()
    ) -> bool:
        """Reserve blocks for ``num_new_tokens`` more tokens; False (and no change) if short.

        ``computed`` are cache hits from ``get_computed_blocks`` not yet owned by the request;
        hits sitting in the free queue count against the free blocks, since touching them takes
        them out of it.
        """
        blocks = self.req_blocks.setdefault(req.request_id, [])
        bs = self.block_size
        total = req.num_computed_tokens + len(computed) * bs + num_new_tokens
        if not computed and total <= len(blocks) * bs and total % bs:
            # The common decode step: room left in the last block, and it is not full yet.
            return True
        need = -(-total // bs) - len(blocks) - len(computed)
        pool = self.pool
        free_hits = sum(1 for b in computed if b.ref_cnt == 0)
        if need > pool.num_free - free_hits:
            if not blocks:
                del self.req_blocks[req.request_id]
            return False
        if computed:
            pool.touch(computed)
            blocks.extend(computed)
            self._num_cached_blocks[req.request_id] = len(blocks)
        if need > 0:
            blocks.extend(pool.allocate(need))
        if self.enable_prefix_caching:
            self._cache_full_blocks(req, blocks, min(total, len(req.all_token_ids)) // bs)
        return True

    def _cache_full_blocks(self, req: KVRequest, blocks: list[KVBlock], num_full: int) -> None:
        done = self._num_cached_blocks.get(req.request_id, 0)
        if num_full <= done:
            return
        self._extend_hashes(req, num_full)
        hashes = req.block_hashes
        pool, bs = self.pool, self.block_size
        run_from = done  # the first block of the run of newly named blocks
        for i in range(done, num_full + 1):
            if i < num_full and pool.cache(blocks[i], hashes[i]):
                continue
            if i > run_from:  # a run ends: at a block named before, or at the end
                pool.stored(hashes[run_from - 1] if run_from else None, hashes[run_from:i],
                            req.all_token_ids[run_from * bs:i * bs])
            run_from = i + 1
        self._num_cached_blocks[req.request_id] = num_full

    def free(self, req: KVRequest) -> None:
        """Release a request's blocks; its tail goes into the queue first so it is evicted first."""
        blocks = self.req_blocks.pop(req.request_id, None)
        self._num_cached_blocks.pop(req.request_id, None)
        if blocks:
            self.pool.free(reversed(blocks))

    def num_blocks_of(self, request_id: str) -> int:
        return len(self.req_blocks.get(request_id, ()))
