"""The GGUF engine's prefix cache: which sequences hold which blocks (with a recording memory), then llama.cpp
itself with kv_unified on (cells shared) and off (streams copied): a clean cache holds isolation and cache
equivalence and verifies, and planted leaks (a colliding key, a sequence reused after release without clearing
it) fail their verdicts and name both sessions."""

from __future__ import annotations

import dataclasses

import pytest
import yaml

from meshbench.engine.base import EngineLimits
from meshbench.engine.gguf_prefix import PrefixHolders
from meshbench.model.prefix import PrefixBlocks, chained_key
from meshbench.sweep.levels import run_concurrency_sweep
from meshbench.sweep.plan import SweepPlan
from meshbench.workload.workload import Workload
from tests.factories import budget

BT = 4


class Recording:
    """A Memory that records llama.cpp's calls."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self.lost: set[int] = set()  # sequences whose copied cells llama.cpp no longer holds

    def cp(self, src: int, dst: int, p0: int, p1: int) -> None:
        self.calls.append(("cp", src, dst, p0, p1))

    def rm(self, seq: int, p0: int, p1: int) -> None:
        self.calls.append(("rm", seq, p0, p1))

    def span(self, seq: int) -> tuple[int, int]:
        """What llama.cpp would hold after the calls so far for ``seq``: a copy holds its run (``lost``: none)."""
        if seq in self.lost:
            return (-1, -1)
        cut = [c for c in self.calls if c[0] == "rm" and c[1] == seq and c[3] == -1]
        cp = [c for c in self.calls if c[0] == "cp" and c[2] == seq]
        end = cut[-1][2] if cut else (cp[-1][4] if cp else 0)
        return (0, end - 1)


def _holders(unified: bool) -> tuple[PrefixHolders, Recording]:
    mem = Recording()
    return PrefixHolders(PrefixBlocks(BT), mem, unified), mem


@pytest.mark.parametrize("unified", [True, False])
def test_a_hit_is_copied_from_a_holder_of_its_last_block(unified):
    h, mem = _holders(unified)
    prompt = list(range(10))  # two whole blocks of 4, then 2 ids of its own
    assert h.attach(0, prompt, 9) == 0
    h.publish(0, prompt)
    assert h.positions == 8 and h.shared(0) == 8
    mem.calls.clear()
    assert h.attach(1, prompt + [99], 10) == 8
    # shared cells: the run's range is tagged; a stream of its own: the whole stream copied, then cut to the run
    assert mem.calls == ([("cp", 0, 1, 0, 8)] if unified else [("cp", 0, 1, -1, -1), ("rm", 1, 8, -1)])
    assert h.positions == 8  # each block once, however many sequences hold it


def test_a_copy_that_does_not_hold_the_whole_run_is_a_miss():
    h, mem = _holders(True)
    prompt = list(range(10))
    h.attach(0, prompt, 9)
    h.publish(0, prompt)
    mem.lost.add(1)  # as with a sliding window in one stream: the copied cells are gone
    assert h.attach(1, prompt, 9) == 0
    assert mem.calls[-1] == ("rm", 1, -1, -1) and h.misses_incomplete == 1 and h.shared(1) == 0


def test_an_ended_session_is_retained_only_for_blocks_nobody_else_holds():
    h, mem = _holders(True)
    h.attach(0, list(range(8)), 7)
    h.publish(0, list(range(8)))
    h.attach(1, list(range(8)) + [50, 51], 9)
    assert h.release(1, list(range(8)) + [50]) is False  # both its blocks are held by sequence 0 too
    assert h.release(0, list(range(9))) is True and h.retained == {0}
    assert ("rm", 0, 8, -1) in mem.calls  # cut back to its whole blocks
    h.attach(2, list(range(4)) + [7, 7, 7, 7, 7], 8)  # shares block 0 only
    h.publish(2, list(range(4)) + [7, 7, 7, 7, 7])
    assert h.release(2, list(range(4)) + [7, 7, 7, 7, 7]) is True and h.retained == {0, 2}
    # a sequence is wanted: the least recently used unreferenced block goes first, until one holder is left
    # with a last block another sequence holds (redundant) or nothing
    freed = h.free_one()
    assert freed in (0, 2) and h.retained == {0, 2} - {freed}
    assert len(h.store) >= 1


def test_evicting_for_room_cuts_holders_from_their_tail_and_frees_the_empty():
    h, mem = _holders(False)
    h.attach(0, list(range(12)), 11)
    h.publish(0, list(range(12)))
    h.release(0, list(range(12)))
    assert h.retained == {0} and h.positions == 12
    assert h.evict_positions(4) == 4 and h.positions == 8
    assert ("rm", 0, 8, -1) in mem.calls
    assert h.evict_positions(100) == 8 and h.positions == 0 and h.retained == set()
    assert mem.calls[-1] == ("rm", 0, -1, -1)


# --- llama.cpp ------------------------------------------------------------------------------------------------
llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python is not importable: the GGUF engine is untested")

from typer.testing import CliRunner  # noqa: E402

from meshbench.cli import app  # noqa: E402
from meshbench.engine.gguf_engine import GgufEngine, plain  # noqa: E402
from meshbench.engine.gguf_prefix import LlamaMemory  # noqa: E402
from meshbench.engine.llama_model import LoadedModel  # noqa: E402

runner = CliRunner()
SEQ = 64


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    p = tmp_path_factory.mktemp("models") / "tiny.gguf"
    r = runner.invoke(app, ["model", "make-tiny", str(p)])
    assert r.exit_code == 0, r.output
    return p


@pytest.fixture(scope="module")
def model(tiny):
    m = LoadedModel(tiny, "cpu", verbose=False)
    yield m
    m.close()


def _workload(prefix_tokens: int = 24, own: int = 6, new: int = 6) -> Workload:
    return Workload(
        (prefix_tokens + own,) * 8, (new,) * 8, seed=3, prefix_groups=(3, 3, 2), prefix_tokens=prefix_tokens
    )


def _sweep(make_engine, wl: Workload, levels=(1, 4), block_tokens: int = BT):
    plan = SweepPlan(
        levels=list(levels),
        workload=wl,
        budget=budget(max_prefill_tokens_per_tick=64),
        isolation_rounds=1,
        prefix_block_tokens=block_tokens,
    )
    return run_concurrency_sweep(plan, make_engine)


def _engine(model, unified: bool, cls=GgufEngine):
    def make(limits: EngineLimits) -> GgufEngine:
        return cls(
            model,
            limits.max_active_sessions,
            SEQ,
            plain(model, threads=2, kv_unified=unified),
            prefix_block_tokens=limits.prefix_block_tokens,
            kv_budget=limits.kv_bytes,
        )

    return make


@pytest.mark.parametrize("unified", [True, False])
def test_a_clean_gguf_cache_holds_isolation_and_cache_equivalence(model, unified):
    sweep = _sweep(_engine(model, unified), _workload())
    for lv in sweep.levels:
        assert lv.isolation_verdict.holds, lv.isolation_verdict
        assert lv.cache_verdict is not None and lv.cache_verdict.holds, lv.cache_verdict
        assert lv.prefix is not None and lv.prefix.saved_tokens > 0
    one = sweep.levels[0].prefix  # alone, in order: every later sharer of a group hits the prefix's 6 blocks
    assert (one.hits, one.misses, one.saved_tokens) == (5, 3, 5 * 24)


@pytest.mark.parametrize("unified", [True, False])
def test_a_gguf_shared_prefix_bundle_verifies(tiny, tmp_path, unified):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "levels": [1, 4],
                "engine": {"kind": "gguf", "model": str(tiny), "kv_unified": unified, "prefix_cache": True},
                "workload": {
                    "sessions": 8,
                    "prompt_tokens": 6,
                    "new_tokens": 6,
                    "prefix": {"groups": [5, 3], "tokens": 24},
                },
            }
        )
    )
    out = tmp_path / "b"
    r = runner.invoke(app, ["sweep", "--config", str(cfg), "--block-tokens", "8", "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert "cache_equivalence=True" in r.output
    r = runner.invoke(app, ["verify", str(out)])
    assert r.exit_code == 0, r.output


def _truncated_key(parent: bytes, ids) -> bytes:
    return chained_key(parent, ())


class _Colliding(GgufEngine):
    """A prefix cache whose key leaves a block's own ids out: every prompt's first blocks collide."""

    def __init__(self, *a, **kw) -> None:
        super().__init__(*a, **kw)
        if self.prefix is not None:
            store = PrefixBlocks(self.prefix.bt, key=_truncated_key)
            self.prefix = PrefixHolders(store, LlamaMemory(self.lib, self.mem), self.kv_unified)


def _leaks(sweep) -> set[tuple[str, str]]:
    return {tuple(x) for lv in sweep.levels for x in lv.isolation_verdict.leaks}


@pytest.mark.parametrize("unified", [True, False])
def test_a_colliding_gguf_key_fails_isolation_and_cache_equivalence_and_names_both(model, unified):
    sweep = _sweep(_engine(model, unified, _Colliding), _workload())
    for lv in sweep.levels:
        assert lv.isolation_verdict.holds is False
        assert lv.cache_verdict is not None and not lv.cache_verdict.holds and lv.cache_verdict.classification == "leak"
    leaks = _leaks(sweep)
    assert ("s3", "prefix:0") in leaks or ("s3", "s0") in leaks, leaks


class _Unclearing(GgufEngine):
    """release() forgets a session but leaves its cells in its llama.cpp sequence; the next prompt given that
    sequence keeps the stale cells' whole blocks and computes only the rest, as if they were its own."""

    def release(self, session_id: str) -> None:
        seq = self._seq_ids.pop(session_id, None)
        if seq is not None:
            self.stale = getattr(self, "stale", {})
            self.stale[seq] = self._stored[session_id]
        for d in (self._stored, self._epoch, self._ids):
            d.pop(session_id, None)

    def _sequence(self, chunk):
        seq, cached = super()._sequence(chunk)
        stale = getattr(self, "stale", {}).pop(seq, 0) if chunk.start == 0 else 0
        keep = min(stale, len(chunk.tokens) - 1) // BT * BT
        if keep:
            self.lib.llama_memory_seq_rm(self.mem, seq, keep, -1)
            self._stored[chunk.session.session_id] = keep
            self._ids[chunk.session.session_id] = list(chunk.tokens[:keep])
            self.silently_reused = keep
        return seq, keep

    def prefill_chunk(self, chunk):
        r = super().prefill_chunk(chunk)
        return dataclasses.replace(r, cached=0)  # it says nothing of the reuse: no cache is on


@pytest.mark.parametrize("unified", [True, False])
def test_a_sequence_reused_without_clearing_fails_isolation_and_names_both(model, unified):
    sweep = _sweep(_engine(model, unified, _Unclearing), _workload(), block_tokens=0)
    assert sweep.isolation.holds is False
    leaks = _leaks(sweep)
    # alone, s1 is given s0's sequence after it: s1's tokens depend on s0's content
    assert ("s1", "s0") in leaks, leaks
    assert all(v != j for v, j in leaks), leaks


@pytest.fixture(scope="module")
def sliding(tiny, tmp_path_factory):
    """The tiny model's weights as a gemma3 file with a sliding window of 8 positions on its layers."""
    import gguf
    import numpy as np

    r = gguf.GGUFReader(tiny)
    p = tmp_path_factory.mktemp("swa") / "swa.gguf"
    w = gguf.GGUFWriter(str(p), "gemma3")
    w.add_name("tiny-swa")
    w.add_context_length(512)
    w.add_embedding_length(64)
    w.add_block_count(3)
    w.add_feed_forward_length(192)
    w.add_head_count(4)
    w.add_head_count_kv(2)
    w.add_key_length(16)
    w.add_value_length(16)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(10000.0)
    w.add_sliding_window(8)
    w.add_file_type(0)
    w.add_vocab_size(256)
    w.add_tokenizer_model(bytes(r.fields["tokenizer.ggml.model"].parts[-1]).decode())
    for t in r.tensors:
        w.add_tensor(t.name, np.array(t.data, dtype=np.float32))
        if t.name.endswith("attn_norm.weight"):
            b = t.name.rsplit(".", 2)[0]
            for name, n in (
                ("attn_q_norm", 16),
                ("attn_k_norm", 16),
                ("post_attention_norm", 64),
                ("post_ffw_norm", 64),
            ):
                w.add_tensor(f"{b}.{name}.weight", np.ones(n, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    m = LoadedModel(p, "cpu", verbose=False)
    yield m
    m.close()


def test_a_run_whose_sliding_window_cells_are_gone_in_one_stream_is_a_miss_not_a_wrong_hit(sliding):
    made: list[GgufEngine] = []

    def make(limits: EngineLimits) -> GgufEngine:
        made.append(_engine(sliding, True)(limits))
        return made[-1]

    wl = Workload((34,) * 24, (6,) * 24, seed=3, prefix_groups=(12, 12), prefix_tokens=24)
    sweep = _sweep(make, wl, levels=(4,), block_tokens=8)
    # with one stream, llama.cpp reused cells past a holder's window: those hits were taken as misses
    assert sum(e.prefix.misses_incomplete for e in made if e.prefix is not None) > 0
    for lv in sweep.levels:
        assert lv.cache_verdict is not None and lv.cache_verdict.holds, lv.cache_verdict
