"""The prefix cache: chained block keys, shared blocks counted once, unreferenced blocks evicted before any
session, the scheduler's counts, and the proofs under sharing: a clean cache passes isolation and cache
equivalence, and each planted leak fails them and names both sides."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from meshbench.analysis import isolation
from meshbench.engine.base import EngineLimits, PrefillChunk, SessionHandle
from meshbench.engine.synthetic import SyntheticEngine
from meshbench.model.kv import HotKvStateManager
from meshbench.model.prefix import ROOT, PrefixBlocks, block_keys, chained_key
from meshbench.sweep.levels import run_concurrency_sweep
from meshbench.sweep.plan import SweepPlan
from meshbench.workload.workload import Workload
from tests.factories import budget, weights

BT = 16


def test_keys_are_chained_over_whole_blocks():
    a = block_keys(list(range(40)), BT)
    assert len(a) == 2  # 40 ids: two whole blocks, the last 8 positions are no block
    assert a[0] == chained_key(ROOT, list(range(16))) and a[1] == chained_key(a[0], list(range(16, 32)))
    # the same ids in block 1 after another block 0: another key (a key names the whole prefix)
    b = block_keys([99] + list(range(1, 32)), BT)
    assert b[1] != a[1]


def _kv(budget_tokens: int, bt: int = 4) -> HotKvStateManager:
    return HotKvStateManager(1, 1, 2, np.float64, budget_tokens * 2 * 1 * 1 * 2 * 8, PrefixBlocks(bt))


def _write(kv: HotKvStateManager, sid: str, ids: list[int], capacity: int = 16) -> None:
    kv.open(sid, 1, capacity)
    cached = kv.attach(sid, 1, ids, len(ids) - 1)
    rest = ids[cached:]
    assert kv.reserve(sid, 1, len(rest), evict=True).fits
    kv.commit(sid, 1, len(rest))
    kv.written(sid, 1, rest)
    kv.publish(sid, 1)


def test_shared_blocks_count_once_and_outlive_their_sessions():
    kv = _kv(100)
    bpt = kv.bytes_per_token
    _write(kv, "a", list(range(10)))  # blocks [0:4] [4:8] published, 2 positions of its own
    assert len(kv.prefix) == 2 and kv.total_bytes == 10 * bpt and kv.prefix_bytes == 8 * bpt
    _write(kv, "b", list(range(8)) + [50, 51, 52])  # both blocks hit: 3 positions of its own
    assert kv._entries[("b", 1)].shared == 8
    assert kv.total_bytes == (8 + 2 + 3) * bpt  # the 8 shared positions once
    kv.release("a")
    kv.release("b")
    assert kv.total_bytes == kv.prefix_bytes == 8 * bpt  # cached, no session left


def test_a_hit_leaves_the_last_position_to_compute():
    kv = _kv(100)
    _write(kv, "a", list(range(8)))
    kv.open("b", 1, 16)
    assert kv.attach("b", 1, list(range(8)), 7) == 4  # the whole prompt is cached; its last block is not taken


def test_unreferenced_blocks_go_before_any_session():
    kv = _kv(14)
    _write(kv, "a", list(range(8)))  # 8 positions, all in two blocks
    kv.release("a")  # two cached blocks, no session
    _write(kv, "b", [100 + i for i in range(5)])  # 5 positions: one block published, 1 own
    assert kv.total_bytes == 13 * kv.bytes_per_token
    kv.open("c", 1, 16)
    r = kv.reserve("c", 1, 4, evict=True)  # 4 more: one unreferenced block goes, b stays
    assert r.fits and r.evicted == () and kv.contains("b", 1) and kv.prefix.evictions == 1
    # the least recently used block went first: the tail of a's chain, so its head still hits
    assert len(kv.prefix.match(block_keys(list(range(8)), 4))) == 1


def test_an_evicted_session_leaves_its_blocks_to_evict_before_the_next_session():
    kv = _kv(20)
    _write(kv, "a", list(range(17)), capacity=20)  # 4 blocks (16 positions) referenced by a, 1 own
    kv.open("b", 1, 20)
    r = kv.reserve("b", 1, 8, evict=True)  # a goes; its 4 blocks, unreferenced now, go before anything else
    assert r.fits and r.evicted == (("a", 1),)
    assert kv.prefix.evictions == 1 and len(kv.prefix) == 3  # as many blocks as the 8 positions still needed


def test_engine_reuses_a_cached_prefix_and_gives_the_same_token():
    cfg, w = weights()
    on = SyntheticEngine(cfg, w, 1 << 30, prefix=PrefixBlocks(BT))
    off = SyntheticEngine(cfg, w, 1 << 30)
    head = tuple(range(3, 3 + 40))
    a, b = head + (7, 8, 9), head + (10, 11)
    for e in (on, off):
        e.prefill(SessionHandle("a", 1, 64), a)
    r_on = on.prefill(SessionHandle("b", 1, 64), b)
    r_off = off.prefill(SessionHandle("b", 1, 64), b)
    assert r_on.cached == 32 and r_off.cached == 0
    assert r_on.token == r_off.token
    # a chunk that is not the prompt's last may be taken from the cache whole
    r = on.prefill_chunk(PrefillChunk(SessionHandle("c", 1, 64), head[:32], 0, False))
    assert r.cached == 32 and r.token is None


def _workload(prefix_tokens: int = 40, own: int = 10, new: int = 6) -> Workload:
    return Workload(
        (prefix_tokens + own,) * 8, (new,) * 8, seed=3, prefix_groups=(3, 3, 2), prefix_tokens=prefix_tokens
    )


def _sweep(make_engine, wl: Workload, levels=(1, 4, 8), prefill: str = "whole"):
    plan = SweepPlan(
        levels=list(levels),
        workload=wl,
        budget=budget(max_prefill_tokens_per_tick=64),
        isolation_rounds=1,
        prefix_block_tokens=BT,
        prefill=prefill,
    )
    return run_concurrency_sweep(plan, make_engine)


def _clean(limits: EngineLimits) -> SyntheticEngine:
    cfg, w = weights()
    prefix = PrefixBlocks(limits.prefix_block_tokens) if limits.prefix_block_tokens else None
    return SyntheticEngine(cfg, w, limits.kv_bytes, prefix=prefix)


@pytest.mark.parametrize("prefill", ["whole", "chunked"])
def test_a_clean_cache_holds_isolation_and_cache_equivalence(prefill):
    sweep = _sweep(_clean, _workload(), prefill=prefill)
    for lv in sweep.levels:
        assert lv.isolation_verdict.holds, lv.isolation_verdict
        assert lv.cache_verdict is not None and lv.cache_verdict.holds, lv.cache_verdict
        assert lv.isolation.groups == {
            "prefix:0": ["s0", "s1", "s2"],
            "prefix:1": ["s3", "s4", "s5"],
            "prefix:2": ["s6", "s7"],
        }
        assert lv.prefix is not None and lv.prefix.saved_tokens > 0
        # chunked: a prompt's first piece takes from the cache only once a block was published before it
        assert prefill == "chunked" or lv.prefix.hits >= 5
    one = sweep.levels[0].prefix  # alone, in order: every later sharer of a group hits both prefix blocks
    assert (one.hits, one.misses, one.saved_tokens) == (5, 3, 5 * 32)
    assert one.computed_tokens == 8 * 50 - 5 * 32


def test_the_prefix_perturbation_keeps_the_sharing():
    wl = _workload()
    reqs = wl.requests(256)
    groups = isolation.prefix_groups(wl.groups())
    out = isolation.requests_for(reqs, ["prefix:1"], {}, 256, 3, 0, groups, 40)
    heads = [r.prompt_tokens[:40] for r in out]
    assert heads[3] == heads[4] == heads[5] != reqs[3].prompt_tokens[:40]  # one new prefix for the whole group
    assert [r.prompt_tokens for r in out[:3] + out[6:]] == [r.prompt_tokens for r in reqs[:3] + reqs[6:]]
    assert [r.prompt_tokens[40:] for r in out] == [r.prompt_tokens[40:] for r in reqs]
    own = isolation.requests_for(reqs, ["s4"], {}, 256, 3, 0, groups, 40)
    assert (
        own[4].prompt_tokens[:40] == reqs[4].prompt_tokens[:40]
        and own[4].prompt_tokens[40:] != reqs[4].prompt_tokens[40:]
    )


# --- planted leaks ------------------------------------------------------------------------------------------
def _truncated_key(parent: bytes, ids) -> bytes:
    """A key truncated to its parent: a block's own ids are left out, so different prefixes collide."""
    return chained_key(parent, ())


def _colliding(limits: EngineLimits) -> SyntheticEngine:
    cfg, w = weights()
    prefix = PrefixBlocks(limits.prefix_block_tokens, key=_truncated_key) if limits.prefix_block_tokens else None
    return SyntheticEngine(cfg, w, limits.kv_bytes, prefix=prefix)


def _planted(manager: type[HotKvStateManager], limits: EngineLimits) -> SyntheticEngine:
    """A clean engine whose KV manager (with a prefix cache) is the planted faulty one."""
    e = _clean(limits)
    if limits.prefix_block_tokens:
        c = e.cfg
        e.kv = manager(c.n_layers, c.n_kv_heads, c.head_dim, c.np_dtype, limits.kv_bytes, PrefixBlocks(BT))
    return e


class _PastTheBoundary(HotKvStateManager):
    """A hit that takes one position past its last whole block, from the session that published the blocks."""

    def publish(self, session_id, epoch):
        self.publisher = self._entries[(session_id, epoch)]
        return super().publish(session_id, epoch)

    def attach(self, session_id, epoch, tokens, limit):
        n = super().attach(session_id, epoch, tokens, limit)
        donor = getattr(self, "publisher", None)
        if n and n + 1 <= limit and donor is not None and donor.length > n:
            cache = self._entries[(session_id, epoch)]
            cache.k[:, n], cache.v[:, n] = donor.k[:, n], donor.v[:, n]
            cache.length += 1
            cache.ids.append(tokens[n])
            n += 1
        return n


def _overrunning(limits: EngineLimits) -> SyntheticEngine:
    return _planted(_PastTheBoundary, limits)


def _leaks(sweep) -> set[tuple[str, str]]:
    return {tuple(x) for lv in sweep.levels for x in lv.isolation_verdict.leaks}


def test_a_truncated_key_fails_isolation_and_cache_equivalence_and_names_both():
    sweep = _sweep(_colliding, _workload(), levels=(1, 4))
    for lv in sweep.levels:
        assert lv.isolation_verdict.holds is False
        assert lv.cache_verdict is not None and not lv.cache_verdict.holds and lv.cache_verdict.classification == "leak"
    leaks = _leaks(sweep)
    # s3 (group 1) read group 0's prefix: the victim and the prefix (s0's group) are named
    assert ("s3", "prefix:0") in leaks or ("s3", "s0") in leaks, leaks


def test_a_reuse_past_the_block_boundary_fails_and_names_both():
    # the prefix ends on a block boundary (as in SGLang#22819): the position past it is a session's own
    sweep = _sweep(_overrunning, _workload(prefix_tokens=32), levels=(1, 4))
    assert sweep.isolation.holds is False
    for lv in sweep.levels:
        assert lv.isolation_verdict.holds is False
        assert lv.cache_verdict is not None and not lv.cache_verdict.holds
    victims = {v for v, _ in _leaks(sweep)}
    named = {(v, j) for v, j in _leaks(sweep) if j.startswith("s")}
    assert victims and named, _leaks(sweep)


class _FirstBlockEverywhere(HotKvStateManager):
    """A hit that copies the chain's first block into every block's positions: a session's own KV is wrong, but
    only with its own group's content, so isolation cannot see it; cache equivalence must."""

    def attach(self, session_id, epoch, tokens, limit):
        n = super().attach(session_id, epoch, tokens, limit)
        cache, bt = self._entries[(session_id, epoch)], self.prefix.block_tokens
        for i in range(1, n // bt):
            cache.k[:, i * bt : (i + 1) * bt] = cache.k[:, :bt]
            cache.v[:, i * bt : (i + 1) * bt] = cache.v[:, :bt]
        return n


def _miscopying(limits: EngineLimits) -> SyntheticEngine:
    return _planted(_FirstBlockEverywhere, limits)


def test_a_miscopied_hit_fails_cache_equivalence_as_corruption_though_isolation_holds():
    sweep = _sweep(_miscopying, _workload(), levels=(1, 4))
    assert sweep.isolation.holds is True and sweep.corruption_free is False
    for lv in sweep.levels:
        v = lv.cache_verdict
        assert v is not None and not v.holds and v.classification == "corruption"
        # the sessions that hit: every sharer after a group's first
        assert {d.session_id for d in v.divergences} <= {"s1", "s2", "s4", "s5", "s7"}


def test_without_a_cache_nothing_is_recorded_of_one():
    wl = dataclasses.replace(_workload(), prefix_groups=(), prefix_tokens=0)
    plan = SweepPlan(levels=[2], workload=wl, budget=budget(), isolation_rounds=1)
    (lv,) = run_concurrency_sweep(plan, _clean).levels
    assert lv.prefix is None and lv.cache_off is None and lv.cache_verdict is None and lv.isolation.groups is None
    assert all(s.cached_tokens is None for s in lv.sessions)
    assert all(t.prefix_hit_tokens is None and t.kv_bytes_shared is None for t in lv.tick_records)


# --- conversations ------------------------------------------------------------------------------------------
def _conversations(prompt: int = 24, new: int = 16) -> Workload:
    return Workload((prompt,) * 6, (new,) * 6, seed=5, turns=3, turn_tokens=8)


def test_a_conversation_is_the_whole_context_so_far_and_reuses_its_blocks():
    sweep = _sweep(_clean, _conversations(), levels=(1, 3))
    for lv in sweep.levels:
        assert sorted((s.session_id, s.epoch) for s in lv.sessions) == [
            (f"s{i}", e) for i in range(6) for e in (1, 2, 3)
        ]
        by = {(s.session_id, s.epoch): s for s in lv.sessions}
        for (sid, e), s in by.items():
            if e > 1:  # the last turn's prompt, its answer, 8 user ids
                assert s.prompt_tokens == by[sid, e - 1].prompt_tokens + 16 + 8
                # the last turn left (24 + 15) // 16 = 2 whole blocks, then (48 + 15) // 16 = 3
                assert s.cached_tokens == {2: 32, 3: 48}[e]
        assert lv.isolation_verdict.holds and lv.cache_verdict.holds and lv.cache_verdict.later_turns == 12
        assert lv.prefix.conversation_misses == 0
        assert [e.session_id for e in lv.turn_events] and all(e.epoch in (2, 3) for e in lv.turn_events)


class _OtherConversation(HotKvStateManager):
    """A later turn given the KV of the conversation released last instead of its own earlier turns'."""

    def release(self, session_id, epoch=None):
        mine = [c for k, c in self._entries.items() if k[0] == session_id]
        freed = super().release(session_id, epoch)
        for c in mine:
            self.donor = (session_id, list(c.blocks))
        return freed

    def attach(self, session_id, epoch, tokens, limit):
        n = super().attach(session_id, epoch, tokens, limit)
        donor = getattr(self, "donor", None)
        if epoch > 1 and donor is not None and donor[0] != session_id:
            cache, bt = self._entries[(session_id, epoch)], self.prefix.block_tokens
            for i, b in enumerate(donor[1][: n // bt]):
                cache.k[:, i * bt : (i + 1) * bt], cache.v[:, i * bt : (i + 1) * bt] = b.k, b.v
        return n


def _handing_over(limits: EngineLimits) -> SyntheticEngine:
    return _planted(_OtherConversation, limits)


def test_a_turn_given_another_conversations_kv_fails_and_names_both():
    sweep = _sweep(_handing_over, _conversations(), levels=(1, 3))
    for lv in sweep.levels:
        assert lv.isolation_verdict.holds is False
        assert lv.cache_verdict is not None and not lv.cache_verdict.holds
        assert lv.cache_verdict.classification == "leak"
        assert all(d.epoch > 1 for d in lv.cache_verdict.divergences)
    leaks = _leaks(sweep)
    assert leaks and all(v != j and j.startswith("s") for v, j in leaks), leaks
