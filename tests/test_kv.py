"""The hot KV state manager: exact accounting, refusals, eviction, misses, release."""

import numpy as np

from meshbench.model.kv import CacheMiss, HotKvStateManager, MissReason

BPT = 2 * 3 * 2 * 16 * 8  # 1536


def _kv(budget_tokens=100):
    return HotKvStateManager(3, 2, 16, np.float64, budget_tokens * BPT)


def held(kv, sid) -> int:
    """The bytes a session's entries hold (every epoch)."""
    return sum(e.length for key, e in kv._entries.items() if key[0] == sid) * kv.bytes_per_token


def _fill(kv, sid, n, epoch=0, capacity=None):
    kv.open(sid, epoch, capacity or n + 4)
    assert kv.reserve(sid, epoch, n).fits
    kv.commit(sid, epoch, n)


def test_bytes_per_token_and_exact_accounting():
    kv = _kv()
    assert kv.bytes_per_token == 1536
    _fill(kv, "a", 4)
    _fill(kv, "b", 7)
    assert kv.total_bytes == 11 * 1536
    assert held(kv, "a") == 4 * 1536
    assert held(kv, "b") == 7 * 1536


def test_preallocated_to_capacity_and_appended_by_slice():
    kv = _kv()
    cache = kv.open("a", 0, 12)
    assert cache.k.shape == (3, 12, 2, 16)
    k_before = cache.k
    for _ in range(12):
        assert kv.reserve("a", 0, 1).fits
        kv.commit("a", 0, 1)
    assert cache.k is k_before  # never reallocated
    assert kv.total_bytes == 12 * 1536


def test_reservation_beyond_budget_is_refused_and_changes_nothing():
    kv = _kv(budget_tokens=10)
    _fill(kv, "a", 8)
    kv.open("b", 0, 5)
    r = kv.reserve("b", 0, 3)
    assert not r.fits
    assert (r.needed_bytes, r.available_bytes) == (3 * 1536, 2 * 1536)
    assert r.evicted == ()
    assert kv.total_bytes == 8 * 1536
    assert not isinstance(kv.lookup("a", 0), CacheMiss)


def test_eviction_is_least_recently_used_and_then_access_is_a_miss():
    kv = _kv(budget_tokens=10)
    _fill(kv, "a", 4)
    _fill(kv, "b", 4)
    kv.lookup("a", 0)  # a is now more recent than b
    kv.open("c", 0, 6)
    r = kv.reserve("c", 0, 4, evict=True)
    assert r.fits and r.evicted == (("b", 0),)
    miss = kv.lookup("b", 0)
    assert miss == CacheMiss("b", 0, MissReason.EVICTED)
    assert kv.misses == 1 and kv.evictions == 1
    assert held(kv, "b") == 0


def test_a_stale_epoch_is_a_miss_never_the_new_data():
    kv = _kv()
    _fill(kv, "a", 4, epoch=1)
    _fill(kv, "a", 2, epoch=2)  # resubmitted: the newer epoch replaces the older
    assert kv.lookup("a", 1) == CacheMiss("a", 1, MissReason.STALE_EPOCH)
    assert kv.lookup("a", 2).length == 2
    assert kv.lookup("zzz", 0) == CacheMiss("zzz", 0, MissReason.UNKNOWN)


def test_release_frees_at_once_and_total_returns_to_zero():
    kv = _kv()
    _fill(kv, "a", 4)
    _fill(kv, "b", 5)
    assert kv.release("a") == 4 * 1536
    assert kv.total_bytes == 5 * 1536
    kv.release("b")
    assert kv.total_bytes == 0 and len(kv) == 0
    assert kv.peak_bytes == 9 * 1536


def test_pending_reservations_count_against_the_budget():
    kv = _kv(budget_tokens=10)
    kv.open("a", 0, 10)
    kv.open("b", 0, 10)
    assert kv.reserve("a", 0, 6).fits
    assert not kv.reserve("b", 0, 6).fits  # a's 6 are held though not yet written
