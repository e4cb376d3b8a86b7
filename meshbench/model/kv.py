"""Hot KV state: per-(session, epoch) caches under one byte budget.

The manager knows shapes and bytes, never the model. It answers two questions as two
calls: ``reserve`` (can n more positions fit? optionally evicting least-recently-used
entries to make room) and ``commit`` (they were written). Bytes are counted on stored
positions: bytes_per_token = 2 x n_layers x n_kv_heads x head_dim x itemsize.
A session's arrays are preallocated to its capacity, so decode appends by slice.

With a prefix store (``meshbench.model.prefix``), a session's first positions may be shared blocks: a hit's
blocks are copied into the session's preallocated arrays (as llama.cpp copies cells between sequences without
a unified cache) and counted once, in the store; the rest of its positions are its own. Under pressure the
blocks no session references are evicted first, least recently used, and only then other sessions.
"""

from __future__ import annotations

import enum
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from meshbench.model.prefix import Block, PrefixBlocks

SessionKey = tuple[str, int]  # (session_id, epoch)


def kv_bytes_per_token(n_layers: int, n_kv_heads: int, head_dim: int, itemsize: int) -> int:
    """K and V, every layer, every KV head: the one formula every engine's KV accounting uses."""
    return 2 * n_layers * n_kv_heads * head_dim * itemsize


class MissReason(str, enum.Enum):
    UNKNOWN = "unknown"
    EVICTED = "evicted"
    STALE_EPOCH = "stale_epoch"


@dataclass(frozen=True, slots=True)
class CacheMiss:
    """What a reader gets instead of a cache it no longer has."""

    session_id: str
    epoch: int
    reason: MissReason


@dataclass(frozen=True, slots=True)
class Reservation:
    """The answer to "can n more positions fit?"; ``fits`` False changes nothing."""

    fits: bool
    needed_bytes: int
    available_bytes: int
    evicted: tuple[SessionKey, ...] = ()


@dataclass(slots=True)
class SessionCache:
    session_id: str
    epoch: int
    k: np.ndarray  # (n_layers, capacity, n_kv_heads, head_dim)
    v: np.ndarray  # (n_layers, capacity, n_kv_heads, head_dim)
    length: int = 0  # positions written and committed
    reserved: int = 0  # positions reserved for a write in progress
    blocks: list[Block] = field(default_factory=list)  # the shared blocks its first positions are, in order
    ids: list[int] = field(default_factory=list)  # the prompt ids written so far (the blocks' keys come from them)
    block_tokens: int = 0

    @property
    def capacity(self) -> int:
        return self.k.shape[1]

    @property
    def shared(self) -> int:
        """Positions that are shared blocks (counted in the store, not here)."""
        return len(self.blocks) * self.block_tokens

    @property
    def own(self) -> int:
        """Positions this session holds alone: written or reserved, less the shared blocks."""
        return self.length + self.reserved - self.shared


@dataclass(slots=True)
class _Counters:
    evictions: int = 0
    misses: int = 0
    peak_bytes: int = 0
    history: dict[str, int] = field(default_factory=dict)  # session_id -> latest epoch


class HotKvStateManager:
    def __init__(
        self,
        n_layers: int,
        n_kv_heads: int,
        head_dim: int,
        dtype,
        budget_bytes: int,
        prefix: PrefixBlocks | None = None,
    ) -> None:
        self.shape = (n_layers, n_kv_heads, head_dim)
        self.prefix = prefix
        self.dtype = np.dtype(dtype)
        self.bytes_per_token = kv_bytes_per_token(n_layers, n_kv_heads, head_dim, self.dtype.itemsize)
        self.budget_bytes = int(budget_bytes)
        self._entries: OrderedDict[SessionKey, SessionCache] = OrderedDict()  # LRU first
        self._evicted: set[SessionKey] = set()
        self._counters = _Counters()
        self._lock = threading.RLock()

    # --- accounting -------------------------------------------------------------
    @property
    def total_bytes(self) -> int:
        """Committed positions: every session's own, and every block in the store once."""
        with self._lock:
            return (sum(e.length - e.shared for e in self._entries.values()) + self._prefix_positions()) * (
                self.bytes_per_token
            )

    @property
    def prefix_bytes(self) -> int:
        """The store's blocks, referenced or not (0 without a store)."""
        with self._lock:
            return self._prefix_positions() * self.bytes_per_token

    def _prefix_positions(self) -> int:
        return self.prefix.positions if self.prefix is not None else 0

    def _held_bytes(self) -> int:
        return (sum(e.own for e in self._entries.values()) + self._prefix_positions()) * self.bytes_per_token

    def contains(self, session_id: str, epoch: int) -> bool:
        """Whether the entry is resident (no LRU touch, no miss counted)."""
        with self._lock:
            return (session_id, epoch) in self._entries

    @property
    def evictions(self) -> int:
        return self._counters.evictions

    @property
    def misses(self) -> int:
        return self._counters.misses

    @property
    def peak_bytes(self) -> int:
        return self._counters.peak_bytes

    def __len__(self) -> int:
        return len(self._entries)

    # --- lifecycle --------------------------------------------------------------
    def open(self, session_id: str, epoch: int, capacity: int) -> SessionCache:
        """Preallocate an empty cache of ``capacity`` positions for (session, epoch).

        Opening a newer epoch drops any older epoch of the same session.
        """
        assert capacity > 0, capacity
        n_layers, n_kv, hd = self.shape
        with self._lock:
            for key in [k for k in self._entries if k[0] == session_id]:
                self._drop(key)
            self._evicted = {k for k in self._evicted if k[0] != session_id}
            cache = SessionCache(
                session_id,
                epoch,
                np.zeros((n_layers, capacity, n_kv, hd), self.dtype),
                np.zeros((n_layers, capacity, n_kv, hd), self.dtype),
                block_tokens=self.prefix.block_tokens if self.prefix is not None else 0,
            )
            self._entries[(session_id, epoch)] = cache
            self._counters.history[session_id] = epoch
            return cache

    def lookup(self, session_id: str, epoch: int) -> SessionCache | CacheMiss:
        """The session's cache (marked most recently used), or a CacheMiss saying why."""
        key = (session_id, epoch)
        with self._lock:
            cache = self._entries.get(key)
            if cache is not None:
                self._entries.move_to_end(key)
                return cache
            self._counters.misses += 1
            if key in self._evicted:
                reason = MissReason.EVICTED
            elif session_id in self._counters.history and self._counters.history[session_id] != epoch:
                reason = MissReason.STALE_EPOCH
            else:
                reason = MissReason.UNKNOWN
            return CacheMiss(session_id, epoch, reason)

    def reserve(self, session_id: str, epoch: int, n_tokens: int, evict: bool = False) -> Reservation:
        """Can ``n_tokens`` more positions of this entry fit the budget? If so, hold them.

        With ``evict``, least-recently-used *other* entries are evicted until they do.
        Only an entry that is open can reserve; a capacity overrun is a caller bug.
        """
        key = (session_id, epoch)
        needed = n_tokens * self.bytes_per_token
        with self._lock:
            cache = self._entries[key]
            assert cache.length + cache.reserved + n_tokens <= cache.capacity, (key, cache.length, n_tokens)
            evicted: list[SessionKey] = []
            available = self.budget_bytes - self._held_bytes()
            victims: list[SessionKey] | None = None  # listed only under pressure (a reserve per decode step)
            while needed > available and evict:
                # NOTE: a cached block no session reads goes before any session's KV; a session evicted
                # leaves its blocks unreferenced, and they go before the next session.
                available += self._evict_unreferenced(needed - available)
                if victims is None:
                    victims = [k for k in self._entries if k != key]
                if needed <= available or not victims:
                    break
                victim = victims.pop(0)
                before = self._held_bytes()
                self._evict(victim)
                available += before - self._held_bytes()
                evicted.append(victim)
            fits = needed <= available
            if fits:
                cache.reserved += n_tokens
            return Reservation(fits, needed, available, tuple(evicted))

    def commit(self, session_id: str, epoch: int, n_tokens: int) -> None:
        """Record that ``n_tokens`` reserved positions were written."""
        with self._lock:
            cache = self._entries[(session_id, epoch)]
            assert n_tokens <= cache.reserved, (session_id, epoch, n_tokens, cache.reserved)
            cache.reserved -= n_tokens
            cache.length += n_tokens
            self._entries.move_to_end((session_id, epoch))
            total = self.total_bytes
            assert total <= self.budget_bytes, (total, self.budget_bytes)
            self._counters.peak_bytes = max(self._counters.peak_bytes, total)

    def release(self, session_id: str, epoch: int | None = None) -> int:
        """Free a session's cache now (every epoch when ``epoch`` is None). With a prefix store, its whole blocks
        (prompt and answer: a conversation's next turn starts with them) are shared first and stay cached.
        Returns the bytes of its own positions freed."""
        with self._lock:
            keys = [k for k in self._entries if k[0] == session_id and (epoch is None or k[1] == epoch)]
            for k in keys:
                self.publish(*k)
            freed = sum(self._entries[k].length - self._entries[k].shared for k in keys) * self.bytes_per_token
            for k in keys:
                self._drop(k)
            self._evicted = {k for k in self._evicted if k[0] != session_id}
            return freed

    # --- shared prefixes ----------------------------------------------------------
    def attach(self, session_id: str, epoch: int, tokens: Sequence[int], limit: int) -> int:
        """Give an empty cache the longest run of cached blocks its prompt ``tokens`` starts with, at most
        ``limit`` positions: the blocks are copied into its arrays and referenced. Returns the positions reused."""
        with self._lock:
            cache = self._entries[(session_id, epoch)]
            assert cache.length == 0 and cache.reserved == 0 and not cache.blocks, (session_id, epoch)
            if self.prefix is None:
                return 0
            bt = self.prefix.block_tokens
            run = self.prefix.match(self.prefix.keys(tokens[: (limit // bt) * bt]))
            for i, b in enumerate(run):
                cache.k[:, i * bt : (i + 1) * bt] = b.k
                cache.v[:, i * bt : (i + 1) * bt] = b.v
            self.prefix.acquire(run)
            cache.blocks = run
            cache.length = len(run) * bt
            cache.ids = list(tokens[: cache.length])
            self._entries.move_to_end((session_id, epoch))
            return cache.length

    def written(self, session_id: str, epoch: int, tokens: Sequence[int]) -> None:
        """The prompt ids just written at the cache's last positions (the keys of its blocks come from them)."""
        with self._lock:
            cache = self._entries[(session_id, epoch)]
            cache.ids.extend(tokens)
            assert len(cache.ids) == cache.length, (session_id, len(cache.ids), cache.length)

    def publish(self, session_id: str, epoch: int) -> int:
        """Share the whole blocks of the session's prompt: each is found in the store or added to it, and the
        session references it instead of holding its positions alone. Returns the blocks added."""
        with self._lock:
            cache = self._entries[(session_id, epoch)]
            if self.prefix is None:
                return 0
            bt, added = self.prefix.block_tokens, 0
            keys = self.prefix.keys(cache.ids)
            for i in range(len(cache.blocks), len(keys)):
                block = self.prefix.get(keys[i])
                if block is None:
                    block = self.prefix.add(
                        keys[i], cache.k[:, i * bt : (i + 1) * bt], cache.v[:, i * bt : (i + 1) * bt]
                    )
                    added += 1
                self.prefix.acquire([block])
                cache.blocks.append(block)
            self.prefix.touch(cache.blocks)
            return added

    def _evict_unreferenced(self, wanted: int) -> int:
        """Evict unreferenced cached blocks, least recently used first, until ``wanted`` bytes are free; returns
        the bytes freed."""
        freed = 0
        if self.prefix is None:
            return 0
        for block in self.prefix.unreferenced():
            if freed >= wanted:
                break
            self.prefix.evict(block)
            freed += self.prefix.block_tokens * self.bytes_per_token
        return freed

    def _drop(self, key: SessionKey) -> None:
        """Forget an entry, its block references with it."""
        cache = self._entries.pop(key)
        if self.prefix is not None:
            self.prefix.release(cache.blocks)

    def _evict(self, key: SessionKey) -> None:
        self._drop(key)
        self._evicted.add(key)
        self._counters.evictions += 1
