"""The GGUF engine's prefix cache: which llama.cpp sequences hold which cached blocks.

The store is the synthetic engine's (``meshbench.model.prefix``): whole blocks keyed by a chained SHA-256,
referenced by the live sessions that read them, each counted once, evicted least recently used from a chain's
tail. Here a block's K/V are cells of llama.cpp sequences, and a sequence that holds a block holds its whole
chain (positions 0 to the block's end), so any holder of a run's last block can give the whole run:

- a live session holds the blocks it took from the cache and the whole blocks it wrote (``publish``);
- a session that ends stays resident as a *retained* sequence, cut back to its whole blocks, while one of its
  blocks has no other holder; it is cut further as its blocks are evicted, and freed when none is left.

A hit is ``llama_memory_seq_cp`` from a holder, checked: the copy must hold every position of the run (with
sliding-window layers in one stream llama.cpp reuses a sequence's cells past its window; that hit is a miss).
With ``kv_unified`` every sequence's cells are in one stream and the copy only tags the run's cells with the new
sequence: the cells are shared, no K/V moves. Without it each sequence has a stream of its own and llama.cpp
copies whole streams only: the source's stream is copied (at the next llama_decode) and the copy is cut back to
the run. Either way the bookkeeping is the same, and a block is counted once, as the synthetic engine counts it;
the copies' cells are llama.cpp's allocation.
This module calls llama.cpp only through ``Memory``; it never sees a batch, a queue or a budget.
"""

from __future__ import annotations

from typing import Protocol, Sequence

from meshbench.model.prefix import Block, PrefixBlocks


class Memory(Protocol):
    """The two llama.cpp memory calls the cache needs (positions [p0, p1); -1: to the end)."""

    def cp(self, src: int, dst: int, p0: int, p1: int) -> None: ...

    def rm(self, seq: int, p0: int, p1: int) -> None: ...

    def span(self, seq: int) -> tuple[int, int]:
        """The lowest and highest position the sequence holds ((-1, -1): none)."""
        ...


class PrefixHolders:
    """The store, and for each block the sequences holding it."""

    def __init__(self, store: PrefixBlocks, memory: Memory, unified: bool) -> None:
        self.store, self.memory, self.unified = store, memory, unified
        self.bt = store.block_tokens
        self._holders: dict[bytes, set[int]] = {}  # block key -> the sequences holding it (and its chain)
        self._chain: dict[int, list[Block]] = {}  # sequence -> the blocks it holds, in order from position 0
        self._live: set[int] = set()  # sequences of live sessions: they reference their chain's blocks
        self.retained: set[int] = set()  # sequences of ended sessions kept for blocks nobody else holds
        self.misses_incomplete = 0  # hits given up: llama.cpp no longer held the whole run (sliding windows)

    @property
    def positions(self) -> int:
        """Positions the store holds, each block once."""
        return self.store.positions

    def shared(self, seq: int) -> int:
        """A live sequence's positions that are cached blocks (counted in the store, not as its own)."""
        return len(self._chain.get(seq, ())) * self.bt

    def attach(self, seq: int, tokens: Sequence[int], limit: int) -> int:
        """Give a new (empty) sequence the longest run of cached blocks ``tokens`` start with, at most ``limit``
        positions, copied from a holder of the run's last block. Returns the positions reused."""
        assert seq not in self._chain and seq not in self.retained, seq
        self._live.add(seq)
        self._chain[seq] = []
        run = self.store.match(self.store.keys(tokens[: (limit // self.bt) * self.bt]))
        if not run:
            return 0
        n = len(run) * self.bt
        src = min(self._holders[run[-1].key])
        if self.unified:
            self.memory.cp(src, seq, 0, n)
        else:  # a whole stream or nothing: copy it, then cut the copy back to the run
            self.memory.cp(src, seq, -1, -1)
            self.memory.rm(seq, n, -1)
        if self.memory.span(seq) != (0, n - 1):
            # llama.cpp no longer holds the whole run: in one stream, a sliding-window layer's cells past a
            # sequence's window are reused by others. Then it is a miss: the prompt is computed whole.
            self.memory.rm(seq, -1, -1)
            self.misses_incomplete += 1
            return 0
        self.store.acquire(run)
        self._hold(seq, run)
        return n

    def publish(self, seq: int, ids: Sequence[int]) -> int:
        """The sequence's whole blocks of ``ids`` (the ids at its positions 0...) join the store or, already
        there, get it as one more holder; it references each. Returns the blocks added."""
        chain = self._chain[seq]
        keys = self.store.keys(ids)
        added = 0
        for key in keys[len(chain) :]:
            block = self.store.get(key)
            if block is None:
                block = self.store.add(key)
                added += 1
            self.store.acquire([block])
            self._hold(seq, [block])
        self.store.touch(chain)
        return added

    def release(self, seq: int, ids: Sequence[int]) -> bool:
        """A live sequence's session ended: its whole blocks (``ids``: prompt and answer written) stay cached.
        Returns whether llama.cpp still holds cells of it (retained), else it is free to clear and reuse."""
        self.publish(seq, ids)
        self._live.discard(seq)
        self.store.release(self._chain[seq])
        if any(self._holders[b.key] == {seq} for b in self._chain[seq]):
            self.retained.add(seq)
            self.memory.rm(seq, len(self._chain[seq]) * self.bt, -1)
            return True
        self._drop(seq)
        return False

    def free_one(self) -> int | None:
        """Make one retained sequence free (clearing it is the caller's): a redundant one (another sequence holds
        its last block, hence its whole chain), else evict unreferenced blocks, least recently used first, until
        one is redundant or holds nothing."""
        for key in [None, *self.store.unreferenced()]:
            emptied = self._evict(key) if key is not None else []
            for seq in emptied[1:]:
                self.memory.rm(seq, -1, -1)
            if emptied:
                return emptied[0]
            for seq in sorted(self.retained):
                chain = self._chain[seq]
                if not chain or len(self._holders[chain[-1].key]) > 1:
                    self._drop(seq)
                    return seq
        return None

    def evict_positions(self, wanted: int) -> int:
        """Evict unreferenced blocks, least recently used first, until ``wanted`` positions are free; returns the
        positions freed. A retained sequence left holding nothing is cleared and freed."""
        freed = 0
        for key in self.store.unreferenced():
            if freed >= wanted:
                break
            for seq in self._evict(key):
                self.memory.rm(seq, -1, -1)
            freed += self.bt
        return freed

    def _hold(self, seq: int, blocks: Sequence[Block]) -> None:
        for b in blocks:
            self._holders.setdefault(b.key, set()).add(seq)
            self._chain[seq].append(b)

    def _evict(self, key: bytes) -> list[int]:
        """Evict one unreferenced block from the store and cut its holders (all retained) back before it; returns
        the holders it left with nothing (now free)."""
        emptied = []
        for seq in sorted(self._holders.pop(key)):
            assert seq in self.retained, (seq, key.hex())
            chain = self._chain[seq]
            assert chain[-1].key == key, (seq, key.hex())  # a chain is evicted from its tail
            chain.pop()
            self.memory.rm(seq, len(chain) * self.bt, -1)
            if not chain:
                self._drop(seq)
                emptied.append(seq)
        self.store.evict(key)
        return emptied

    def _drop(self, seq: int) -> None:
        """The sequence holds nothing any more (its cells are the caller's to clear)."""
        for b in reversed(self._chain.pop(seq, [])):
            holders = self._holders.get(b.key)
            if holders is not None:
                holders.discard(seq)
                if not holders:  # a failed session's own blocks: nobody holds their cells any more
                    del self._holders[b.key]
                    self.store.evict(b.key)
        self.retained.discard(seq)
        self._live.discard(seq)


class LlamaMemory:
    """``Memory`` over a llama.cpp context's memory (llama_memory_seq_cp, llama_memory_seq_rm)."""

    def __init__(self, lib, mem) -> None:
        self.lib, self.mem = lib, mem

    def cp(self, src: int, dst: int, p0: int, p1: int) -> None:
        self.lib.llama_memory_seq_cp(self.mem, src, dst, p0, p1)

    def rm(self, seq: int, p0: int, p1: int) -> None:
        self.lib.llama_memory_seq_rm(self.mem, seq, p0, p1)

    def span(self, seq: int) -> tuple[int, int]:
        return (
            int(self.lib.llama_memory_seq_pos_min(self.mem, seq)),
            int(self.lib.llama_memory_seq_pos_max(self.mem, seq)),
        )
