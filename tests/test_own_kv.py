"""The own-KV replay (meshbench.sweep.own_kv): a conversation level fed again without the prefix cache, each later
turn on its session's own llama.cpp sequence, gives every token the cache-on pass recorded when the cache gave
each turn its own KV; a token it did not, or a cache that corrupts what it holds, is named. And the classification
it feeds: a conversation's later turns after its first divergence are not classified again."""

from __future__ import annotations

import dataclasses

import pytest
from typer.testing import CliRunner

from meshbench.analysis import prefix
from meshbench.cli import app
from meshbench.engine.base import EngineLimits
from meshbench.records.sharing import CacheDivergence, OwnKvReplay
from meshbench.sweep import own_kv
from meshbench.sweep.levels import run_concurrency_sweep
from meshbench.sweep.plan import SweepPlan
from meshbench.workload.workload import Workload
from tests.factories import budget

pytest.importorskip("llama_cpp", reason="llama-cpp-python is not importable")
from meshbench.engine.gguf_engine import GgufEngine, plain  # noqa: E402
from meshbench.engine.llama_model import LoadedModel  # noqa: E402

runner = CliRunner()
BT, SEQ = 8, 96


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    p = tmp_path_factory.mktemp("models") / "tiny.gguf"
    r = runner.invoke(app, ["model", "make-tiny", str(p)])
    assert r.exit_code == 0, r.output
    m = LoadedModel(p, "cpu", verbose=False)
    yield m
    m.close()


def _engine(model, cls=GgufEngine):
    def make(limits: EngineLimits) -> GgufEngine:
        return cls(
            model,
            limits.max_active_sessions,
            SEQ,
            plain(model, threads=2),
            prefix_block_tokens=limits.prefix_block_tokens,
            kv_budget=limits.kv_bytes,
        )

    return make


WL = Workload((12,) * 4, (10,) * 4, seed=4, turns=3, turn_tokens=6)


def _sweep(make, levels=(1, 4)):
    plan = SweepPlan(
        levels=list(levels),
        workload=WL,
        budget=budget(max_prefill_tokens_per_tick=64),
        isolation_rounds=1,
        prefix_block_tokens=BT,
    )
    return run_concurrency_sweep(plan, make)


def _replay(model, lv):
    engine = _engine(model)(EngineLimits(WL.sessions, 1 << 26, 64))
    try:
        return own_kv.own_kv(engine, lv.sessions, lv.tick_records, WL.requests(engine.vocab_size))
    finally:
        engine.close()


def test_a_clean_cache_is_reproduced_on_own_kv_and_a_forged_token_is_named(model):
    sweep = _sweep(_engine(model))
    for lv in sweep.levels:
        assert lv.cache_verdict is not None and lv.cache_verdict.holds  # (so the sweep ran no replay)
        assert lv.cache_verdict.own_kv is None and prefix.replayable(lv.sessions, lv.tick_records)
        assert sum(s.cached_tokens or 0 for s in lv.sessions) > 0  # later turns took their earlier blocks
        total = sum(len(s.tokens) for s in lv.sessions)
        assert _replay(model, lv) == OwnKvReplay(reproduced=True, tokens=total)
    lv = sweep.levels[1]
    k = next(i for i, s in enumerate(lv.sessions) if s.session_id == "s2" and s.epoch == 3)
    s = lv.sessions[k]
    forged = dataclasses.replace(s, tokens=[*s.tokens[:4], (s.tokens[4] + 1) % model.vocab_size, *s.tokens[5:]])
    lv = dataclasses.replace(lv, sessions=[*lv.sessions[:k], forged, *lv.sessions[k + 1 :]])
    got = _replay(model, lv)
    assert (got.reproduced, got.session_id, got.epoch, got.index) == (False, "s2", 3, 4)


class _Corrupting(GgufEngine):
    """A prefix cache whose hits hold another id's KV at their last cached position: each later turn reads its
    own earlier turn, but not as computed. No other session is involved."""

    def _sequence(self, chunk):
        seq, cached = super()._sequence(chunk)
        if cached and chunk.start == 0:
            wrong = (chunk.tokens[cached - 1] + 1) % self.model.vocab_size
            self.lib.llama_memory_seq_rm(self.mem, seq, cached - 1, -1)
            self._fill([(wrong, seq, cached - 1, False)])
            self._decode("prefill")
        return seq, cached


def test_a_cache_that_corrupts_its_hits_is_not_reproduced_and_is_called_corruption(model):
    sweep = _sweep(_engine(model, _Corrupting), levels=(1,))
    lv = sweep.levels[0]
    assert lv.isolation_verdict.holds  # nothing crossed sessions
    v = lv.cache_verdict
    assert v is not None and not v.holds and v.own_kv is not None and not v.own_kv.reproduced, v
    assert v.own_kv.epoch is not None and v.own_kv.epoch > 1  # a later turn, the first to read a corrupted hit
    assert v.classification == "corruption" and not sweep.corruption_free


def _div(sid: str, epoch: int, margin_off: float) -> CacheDivergence:
    return CacheDivergence(
        session_id=sid, epoch=epoch, index=0, token_on=1, token_off=2, margin_on=margin_off, margin_off=margin_off
    )


def test_a_turn_after_its_conversations_first_divergence_is_not_classified_again():
    found = [_div("s0", 2, 0.01), _div("s0", 3, 3.0), _div("s1", 3, 0.02)]
    assert prefix.first_turns(found) == [found[0], found[2]]
    # without a replay, s0's third turn went unexamined (its context differed): not called numerics
    assert prefix._classify(found, True, 0.05, None) == "unclassified"
    assert prefix._classify([found[0], found[2]], True, 0.05, None) == "engine numerics"
    confident = [_div("s0", 2, 0.3)]
    assert prefix._classify(confident, True, 0.05, None) == "corruption"
    assert prefix._classify(found + confident, True, 0.05, OwnKvReplay(reproduced=True, tokens=9)) == "engine numerics"
    missed = OwnKvReplay(reproduced=False, tokens=3, session_id="s0", epoch=2, index=1)
    assert prefix._classify(confident, True, 0.05, missed) == "corruption"
    assert prefix._classify([found[0]], True, 0.05, missed) == "corruption"  # a near-tie, but the replay missed
    assert prefix._classify(confident, False, 0.05, OwnKvReplay(reproduced=True, tokens=9)) == "leak"
    assert prefix._classify(confident, None, 0.05, OwnKvReplay(reproduced=True, tokens=9)) == "unclassified"
