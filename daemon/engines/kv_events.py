"""KV cache events as vLLM publishes them, and each program's residency they give.

vLLM (with `KVEventsConfig`) publishes, after each engine step, which full blocks entered its
prefix cache (`BlockStored`: their hashes, the parent's hash, their token ids, the medium) and
which left it (`BlockRemoved`), or that all of it was dropped (`AllBlocksCleared`). The structs
here decode those payloads (unknown fields are ignored, so a newer vLLM's extra fields pass);
the sim engine emits the same structs in process.

`Residency` mirrors the cache from those events and answers, per program, how many leading
tokens of the context its last request left behind are still cached. Blocks are named by
content, not by the engine's hash (whose function and seed are the engine's business): a
block's key is `block_hash(parent key, its token ids)`, the sim engine's own scheme, so a
program's keys follow from its token ids alone and its residency needs no event to have
arrived when its request ends. Two engine blocks with equal tokens under equal parents (a
LoRA or cache salt apart) share a key; agentd uses neither.

The medium says which tier holds a block: the engine's own cache ("GPU" in vLLM's events,
also on its CPU build, or none) or a lower tier it can restore from without recompute (vLLM's
CPU offloading connector publishes medium "CPU"). A program's `cached` count is its leading
blocks in the engine's cache; `reachable` counts blocks in either.

Work is proportional to the events and to the programs whose blocks they name, not to all
programs: each key indexes the programs holding it and where.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import msgspec

from daemon.workers.protocol import ProgramResidency

EngineHash = bytes | int
PRIMARY_MEDIA = frozenset({None, "GPU"})  # vLLM labels its own block pool "GPU" everywhere


class BlockStored(msgspec.Struct, tag=True, omit_defaults=True):
    block_hashes: list[EngineHash]
    parent_block_hash: EngineHash | None
    token_ids: list[int]
    block_size: int
    medium: str | None = None


class BlockRemoved(msgspec.Struct, tag=True, omit_defaults=True):
    block_hashes: list[EngineHash]
    medium: str | None = None


class AllBlocksCleared(msgspec.Struct, tag=True, omit_defaults=True):
    pass


KvEvent = BlockStored | BlockRemoved | AllBlocksCleared


class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True):
    ts: float
    events: list[KvEvent]
    data_parallel_rank: int | None = None


# The first block of every sequence hangs off this parent; any fixed int would do.
ROOT_HASH = 0x5A6E7D


def block_hash(parent: int, tokens: Sequence[int]) -> int:
    """A block's content key. Python's hash of a tuple of ints is not salted by
    PYTHONHASHSEED (only str and bytes are), so keys agree across processes."""
    return hash((parent, tuple(tokens)))


_batch_decoder = msgspec.msgpack.Decoder(EventBatch)


def decode_batch(payload: bytes) -> EventBatch:
    """One published batch (the last frame of vLLM's topic, sequence, payload message)."""
    return _batch_decoder.decode(payload)


@dataclass
class _Program:
    keys: list[int]  # the content keys of its context's full blocks, in order
    cached: int = 0  # leading keys in the engine's cache
    reachable: int = 0  # leading keys in the engine's cache or a lower tier
    seen: bool = False  # some of it was cached since it was remembered


@dataclass
class _Block:
    primary: int = 0  # engine blocks holding this content in the engine's cache
    lower: int = 0  # ... in a lower tier


class Residency:
    """The engine's cached blocks, mirrored from its events, and programs' residency."""

    def __init__(self, block_size: int, max_programs: int = 4096) -> None:
        self.block_size = block_size
        self.max_programs = max_programs
        self._key_of: dict[tuple[EngineHash, bool], int] = {}  # (engine hash, primary) -> key
        self._blocks: dict[int, _Block] = {}
        self._programs: dict[str, _Program] = {}  # least recently remembered first
        self._holders: dict[int, dict[str, int]] = {}  # key -> {program: position}
        self._changed: set[str] = set()
        self._dropped: set[str] = set()

    # --- programs --------------------------------------------------------------------

    def keys(self, token_ids: list[int]) -> list[int]:
        bs = self.block_size
        out: list[int] = []
        parent = ROOT_HASH
        for i in range(len(token_ids) // bs):
            parent = block_hash(parent, token_ids[i * bs:(i + 1) * bs])
            out.append(parent)
        return out

    def remember(self, program_id: str, token_ids: list[int] | None = None,
                 keys: list[int] | None = None) -> None:
        """The program's request ended, leaving a context of `token_ids` in the KV (or of
        blocks with content `keys`, when the caller has them: the sim engine does)."""
        keys = keys if keys is not None else self.keys(token_ids or [])
        old = self._programs.get(program_id)
        # It grew: equal last keys mean equal chains before them, whose index entries stay.
        grew = old is not None and 0 < len(old.keys) <= len(keys) \
            and keys[len(old.keys) - 1] == old.keys[-1]
        if grew:
            del self._programs[program_id]  # back in below, as the newest
        else:
            self._unindex(program_id)
        kept = len(old.keys) if old is not None and grew else 0
        program = _Program(keys)
        for pos in range(kept, len(keys)):
            self._holders.setdefault(keys[pos], {})[program_id] = pos
        # The kept part's counts are current (events kept them so): scan on from there.
        cached, reachable = (old.cached, old.reachable) if old is not None and grew else (0, 0)
        program.cached = self._run(keys, min(kept, cached), True)
        program.reachable = self._run(keys, min(kept, reachable), False)
        program.seen = program.reachable > 0
        self._programs[program_id] = program
        self._changed.add(program_id)
        self._dropped.discard(program_id)
        while len(self._programs) > self.max_programs:
            self.forget(next(iter(self._programs)))

    def forget(self, program_id: str) -> None:
        if self._unindex(program_id):
            self._changed.discard(program_id)
            self._dropped.add(program_id)

    def _unindex(self, program_id: str) -> bool:
        program = self._programs.pop(program_id, None)
        if program is None:
            return False
        for key in program.keys:
            holders = self._holders.get(key)
            if holders is not None:
                holders.pop(program_id, None)
                if not holders:
                    del self._holders[key]
        return True

    def of(self, program_id: str) -> ProgramResidency | None:
        """The program's residency in tokens; None: not tracked."""
        p = self._programs.get(program_id)
        if p is None:
            return None
        bs = self.block_size
        return ProgramResidency(len(p.keys) * bs, p.cached * bs, p.reachable * bs)

    def take_report(self, everything: bool = False
                    ) -> tuple[dict[str, ProgramResidency], list[str]]:
        """What changed since the last call (or all of it, `everything`): the residency of
        programs, and the programs no longer tracked. A program all of whose blocks were
        evicted is reported once at zero and then no longer tracked (one none of whose blocks
        was seen yet is kept: vLLM may publish them after the request's end)."""
        names = list(self._programs) if everything else sorted(self._changed)
        report = {pid: r for pid in names if (r := self.of(pid)) is not None}
        dropped = sorted(self._dropped)
        self._changed.clear()
        self._dropped.clear()
        for pid, r in report.items():
            if r.reachable_tokens == 0 and self._programs[pid].seen:
                self._unindex(pid)
        return report, dropped

    # --- events ----------------------------------------------------------------------

    def apply_all(self, events: Sequence[KvEvent]) -> None:
        for event in events:
            self.apply(event)

    def apply(self, event: KvEvent) -> None:
        if isinstance(event, BlockStored):
            self._stored(event)
        elif isinstance(event, BlockRemoved):
            primary = event.medium in PRIMARY_MEDIA
            for engine_hash in event.block_hashes:
                key = self._key_of.pop((engine_hash, primary), None)
                if key is not None:
                    self._remove(key, primary)
        else:
            self._clear()

    def _stored(self, event: BlockStored) -> None:
        primary = event.medium in PRIMARY_MEDIA
        bs = event.block_size
        if event.parent_block_hash is None:
            parent: int | None = ROOT_HASH
        else:  # the parent may be known only on the other tier (a block restored upward)
            parent = self._key_of.get((event.parent_block_hash, primary),
                                      self._key_of.get((event.parent_block_hash, not primary)))
        for i, engine_hash in enumerate(event.block_hashes):
            # A block moving between tiers keeps its engine hash (vLLM's offloading publishes
            # no tokens for it): its key is the one it had on the other tier.
            key = self._key_of.get((engine_hash, not primary))
            if key is None:
                tokens = event.token_ids[i * bs:(i + 1) * bs]
                if parent is None or bs <= 0 or len(tokens) < bs:
                    parent = None  # unknown: so is every block after it in this run
                    continue
                key = block_hash(parent, tokens)
            if (engine_hash, primary) not in self._key_of:
                self._key_of[(engine_hash, primary)] = key
                self._add(key, primary)
            parent = key

    def _add(self, key: int, primary: bool) -> None:
        block = self._blocks.setdefault(key, _Block())
        if primary:
            block.primary += 1
        else:
            block.lower += 1
        for pid, pos in self._holders.get(key, {}).items():
            p = self._programs[pid]
            if primary and p.cached == pos:
                p.cached = self._run(p.keys, pos, primary=True)
                self._changed.add(pid)
            if p.reachable == pos:
                p.reachable = self._run(p.keys, pos, primary=False)
                p.seen = True
                self._changed.add(pid)

    def _remove(self, key: int, primary: bool) -> None:
        block = self._blocks.get(key)
        if block is None:
            return
        if primary:
            block.primary -= 1
        else:
            block.lower -= 1
        if block.primary <= 0 and block.lower <= 0:
            del self._blocks[key]
        for pid, pos in self._holders.get(key, {}).items():
            p = self._programs[pid]
            if primary and block.primary <= 0 and pos < p.cached:
                p.cached = pos
                self._changed.add(pid)
            if block.primary <= 0 and block.lower <= 0 and pos < p.reachable:
                p.reachable = pos
                self._changed.add(pid)

    def _clear(self) -> None:
        """The engine dropped its own cache (vLLM's reset_prefix_cache); lower tiers stay."""
        for (engine_hash, primary), key in list(self._key_of.items()):
            if primary:
                del self._key_of[(engine_hash, primary)]
                self._remove(key, primary)

    def _run(self, keys: list[int], start: int, primary: bool) -> int:
        """How many of `keys` from the start are present, given the first `start` are."""
        n = start
        blocks = self._blocks
        while n < len(keys):
            block = blocks.get(keys[n])
            if block is None or (primary and block.primary <= 0):
                break
            n += 1
        return n
