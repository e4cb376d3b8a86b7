"""Hot KV state: per-(session, epoch) caches under one byte budget.

The manager knows shapes and bytes, never the model. It answers two questions as two
calls: ``reserve`` (can n more positions fit? optionally evicting least-recently-used
entries to make room) and ``commit`` (they were written). Bytes are counted on stored
positions: bytes_per_token = 2 x n_layers x n_kv_heads x head_dim x itemsize.
A session's arrays are preallocated to its capacity, so decode appends by slice.
"""

from __future__ import annotations

import enum
import threading
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np

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

    @property
    def capacity(self) -> int:
        return self.k.shape[1]


@dataclass(slots=True)
class _Counters:
    evictions: int = 0
    misses: int = 0
    peak_bytes: int = 0
    history: dict[str, int] = field(default_factory=dict)  # session_id -> latest epoch


class HotKvStateManager:
    def __init__(self, n_layers: int, n_kv_heads: int, head_dim: int, dtype, budget_bytes: int) -> None:
        self.shape = (n_layers, n_kv_heads, head_dim)
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
        with self._lock:
            return sum(e.length for e in self._entries.values()) * self.bytes_per_token

    def _held_bytes(self) -> int:
        return sum(e.length + e.reserved for e in self._entries.values()) * self.bytes_per_token

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
                del self._entries[key]
            self._evicted = {k for k in self._evicted if k[0] != session_id}
            cache = SessionCache(
                session_id,
                epoch,
                np.zeros((n_layers, capacity, n_kv, hd), self.dtype),
                np.zeros((n_layers, capacity, n_kv, hd), self.dtype),
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
            if needed > available and evict:
                for victim in [k for k in self._entries if k != key]:
                    if needed <= available:
                        break
                    v = self._entries[victim]
                    available += (v.length + v.reserved) * self.bytes_per_token
                    self._evict(victim)
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
        """Free a session's cache now (every epoch when ``epoch`` is None); returns bytes freed."""
        with self._lock:
            keys = [k for k in self._entries if k[0] == session_id and (epoch is None or k[1] == epoch)]
            freed = sum(self._entries[k].length for k in keys) * self.bytes_per_token
            for k in keys:
                del self._entries[k]
            self._evicted = {k for k in self._evicted if k[0] != session_id}
            return freed

    def _evict(self, key: SessionKey) -> None:
        del self._entries[key]
        self._evicted.add(key)
        self._counters.evictions += 1
