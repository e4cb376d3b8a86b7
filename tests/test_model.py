"""The numpy dense Llama: cached decode, batched decode, golden stream, conventions."""

import factories as f
import numpy as np
import pytest

from meshbench.engine.base import DecodeItem, SessionHandle
from meshbench.model import gguf_io, llama
from meshbench.model.config import PRESETS, ModelConfig, preset
from meshbench.model.kv import HotKvStateManager
from meshbench.model.weights import init_weights

GOLDEN_DGR012 = [142, 214, 197, 84, 151, 197, 84, 151, 197, 84, 59, 32, 37, 160, 175, 219]


def _slot(cfg, capacity):
    kv = HotKvStateManager(cfg.n_layers, cfg.n_kv_heads, cfg.head_dim, cfg.np_dtype, 1 << 30)
    return kv.open("x", 0, capacity)


def _full_recompute(cfg, w, tokens):
    slot = _slot(cfg, len(tokens))
    return llama.prefill(cfg, w, slot, tokens)


def _generate(engine, sid, prompt, n):
    r = engine.prefill(SessionHandle(sid, 0, len(prompt) + n), prompt)
    toks = [r.token]
    for i in range(n - 1):
        (r,) = engine.decode_batch([DecodeItem(sid, 0, len(prompt) + i, toks[-1])])
        toks.append(r.token)
    return toks


def test_presets_have_the_documented_sizes():
    assert preset("dgr-012").kv_bytes_per_token == 1536
    assert preset("bench").dtype == "float32"
    assert preset("bench").n_params >= 50_000_000


def test_same_seed_gives_bitwise_identical_weights_and_other_seed_differs():
    cfg = preset("dgr-012")
    a, b, c = init_weights(cfg, 0), init_weights(cfg, 0), init_weights(cfg, 1)
    assert a.sha256() == b.sha256()
    assert a.sha256() != c.sha256()
    assert a.layers[0].wq.shape == (cfg.dim, cfg.dim)  # (out, in)
    assert a.layers[0].wk.shape == (cfg.kv_dim, cfg.dim)
    assert a.layers[0].w_down.shape == (cfg.dim, cfg.ffn_dim)


@pytest.mark.parametrize("prompt_len", [1, 3, 7, 16])
def test_cached_decode_equals_full_recompute(prompt_len):
    cfg, w = f.weights()
    rng = np.random.default_rng(prompt_len)
    seq = [int(t) for t in rng.integers(0, cfg.vocab_size, prompt_len)]
    slot = _slot(cfg, prompt_len + 6)
    logits = llama.prefill(cfg, w, slot, seq)
    slot.length = prompt_len
    np.testing.assert_allclose(logits, _full_recompute(cfg, w, seq), rtol=0, atol=1e-12)
    for _ in range(6):
        seq.append(int(np.argmax(logits)))
        logits = llama.decode(cfg, w, [slot], [seq[-1]])[0]
        slot.length += 1
        full = _full_recompute(cfg, w, seq)
        dev = float(np.max(np.abs(logits - full)))
        assert dev < 1e-10, f"cached decode deviates from recompute by {dev:.3e} at length {len(seq)}"


def test_golden_token_stream_dgr012():
    toks = _generate(f.engine(), "g", [1, 2, 3, 4], 16)
    assert toks == GOLDEN_DGR012
    assert len(set(toks)) >= 8, f"greedy stream collapsed: {toks}"


def test_batched_decode_equals_single_session_decodes():
    cfg, w = f.weights()
    prompts = [[5], [1, 2, 3], [9, 8, 7, 6, 5, 4, 3], [200, 100, 50, 25, 12]]
    batched, single = f.engine(), f.engine()
    toks_b, toks_s = {}, {}
    for i, p in enumerate(prompts):
        sid = f"s{i}"
        toks_b[sid] = [batched.prefill(SessionHandle(sid, 0, 20), p).token]
        toks_s[sid] = [single.prefill(SessionHandle(sid, 0, 20), p).token]
    max_dev = 0.0
    for step in range(6):
        items = [DecodeItem(f"s{i}", 0, len(p) + step, toks_b[f"s{i}"][-1]) for i, p in enumerate(prompts)]
        slots = [batched.kv.lookup(it.session_id, 0) for it in items]
        batch_logits = llama.decode(cfg, w, slots, [it.token for it in items])  # (B, vocab)
        for it, row in zip(items, batch_logits):
            s_slot = single.kv.lookup(it.session_id, 0)
            one = llama.decode(cfg, w, [s_slot], [toks_s[it.session_id][-1]])[0]
            max_dev = max(max_dev, float(np.max(np.abs(row - one))))
            assert int(np.argmax(row)) == int(np.argmax(one)), f"{it.session_id} step {step}"
            batched.kv.reserve(it.session_id, 0, 1)
            batched.kv.commit(it.session_id, 0, 1)
            single.kv.reserve(it.session_id, 0, 1)
            single.kv.commit(it.session_id, 0, 1)
            toks_b[it.session_id].append(int(np.argmax(row)))
            toks_s[it.session_id].append(int(np.argmax(one)))
    assert max_dev < 1e-9, f"batched logits deviate from single-session logits by {max_dev:.3e}"
    assert toks_b == toks_s


def test_engine_batch_of_four_reproduces_each_session_alone():
    prompts = {"a": [1, 2, 3, 4], "b": [7], "c": [40, 41], "d": [3, 3, 3, 3, 3, 3]}
    alone = {sid: _generate(f.engine(), sid, p, 8) for sid, p in prompts.items()}
    e = f.engine()
    toks = {sid: [e.prefill(SessionHandle(sid, 0, 20), p).token] for sid, p in prompts.items()}
    for step in range(7):
        items = [DecodeItem(sid, 0, len(p) + step, toks[sid][-1]) for sid, p in prompts.items()]
        for it, r in zip(items, e.decode_batch(items)):
            toks[it.session_id].append(r.token)
    assert toks == alone
    assert len({tuple(t) for t in alone.values()}) == 4  # four divergent references


def test_rope_rotates_adjacent_pairs_like_llama_cpp():
    x = np.zeros((1, 1, 4))
    x[0, 0, 0] = 1.0  # pair (x0, x1) = (1, 0)
    x[0, 0, 2] = 1.0  # pair (x2, x3) = (1, 0)
    out = llama.rope(x, np.array([3]), theta=10000.0)
    # pair i rotates by pos * theta^(-2i/hd): angle 3 for i=0, 3 * 10000^(-1/2) for i=1
    np.testing.assert_allclose(out[0, 0, :2], [np.cos(3.0), np.sin(3.0)], atol=1e-15)
    a = 3.0 * 10000.0**-0.5
    np.testing.assert_allclose(out[0, 0, 2:], [np.cos(a), np.sin(a)], atol=1e-15)


def test_gqa_query_head_reads_kv_head_h_div_group():
    cfg = ModelConfig(vocab_size=8, dim=8, n_layers=1, n_heads=4, n_kv_heads=2, ffn_dim=8, dtype="float64")
    q = np.ones((1, 4, 2))
    k = np.zeros((2, 2, 2))
    v = np.zeros((2, 2, 2))
    v[:, 0, :] = 1.0  # KV head 0 holds ones
    v[:, 1, :] = 2.0  # KV head 1 holds twos
    out = llama._attend(cfg, q, k, v, np.array([1])).reshape(4, 2)
    np.testing.assert_allclose(out[:, 0], [1.0, 1.0, 2.0, 2.0])


def test_invalid_model_config_names_the_field():
    from meshbench.errors import MeshbenchError

    with pytest.raises(MeshbenchError, match="n_kv_heads"):
        ModelConfig(vocab_size=8, dim=8, n_layers=1, n_heads=4, n_kv_heads=3, ffn_dim=8)
    with pytest.raises(MeshbenchError, match="dtype"):
        ModelConfig(vocab_size=8, dim=8, n_layers=1, n_heads=4, n_kv_heads=2, ffn_dim=8, dtype="int8")
    assert set(PRESETS) == {"dgr-012", "bench"}


def test_make_tiny_writes_a_llama_vocabulary_that_llama_cpp_loads_and_tokenizes(tmp_path):
    """Byte fallback, BOS/EOS/UNK and generated pieces, bit for bit the same file twice."""
    llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python is not importable")
    import ctypes

    from meshbench.model import vocab

    tokens, scores, types = vocab.pieces(300)
    assert tokens[:4] == ["<unk>", "<s>", "</s>", "<0x00>"] and tokens[258] == "<0xFF>"
    assert tokens[259:264] == ["\u2581", "\u2581a", "a", "\u2581b", "b"] and len(set(tokens)) == 300
    assert types[:4] == [2, 3, 3, 6] and scores[259] > scores[260]
    a, b = tmp_path / "a.gguf", tmp_path / "b.gguf"
    for p in (a, b):
        gguf_io.write(p, preset("bench"), init_weights(preset("bench"), 0), "q4_0")
    assert a.read_bytes() == b.read_bytes()
    model = llama_cpp.llama_model_load_from_file(str(a).encode(), llama_cpp.llama_model_default_params())
    try:
        v = llama_cpp.llama_model_get_vocab(model)
        assert llama_cpp.llama_vocab_type(v) == llama_cpp.LLAMA_VOCAB_TYPE_SPM
        assert (llama_cpp.llama_vocab_bos(v), llama_cpp.llama_vocab_eos(v)) == (1, 2)
        text = "hello world, \u00e9"
        buf = (llama_cpp.llama_token * 64)()
        n = llama_cpp.llama_tokenize(v, text.encode(), len(text.encode()), buf, 64, True, False)
        ids = list(buf[:n])
        assert ids[0] == 1 and all(0 <= t < 8192 for t in ids)
        out = ctypes.create_string_buffer(32)
        pieces = []
        for t in ids[1:]:
            k = llama_cpp.llama_token_to_piece(v, t, out, 32, 0, False)
            pieces.append(out.raw[:k])
        assert b"".join(pieces).decode() == " " + text  # the word-start marker, then every byte back
    finally:
        llama_cpp.llama_model_free(model)


def test_a_preset_too_small_for_a_vocabulary_gets_none():
    from meshbench.model import vocab

    assert preset("dgr-012").vocab_size < vocab.MIN_VOCAB
    with pytest.raises(ValueError, match="at least 259 ids"):
        vocab.pieces(256)


def _meta(**over):
    from meshbench.engine import kv_geometry  # noqa: F401

    m = {
        "general.architecture": "x",
        "x.block_count": 3,
        "x.attention.head_count": [4, 8, 4],
        "x.attention.head_count_kv": [4, 8, 4],
        "x.embedding_length": 768,
    }
    m.update({f"x.{k}": v for k, v in over.items()})
    return m


def test_kv_geometry_takes_the_default_key_length_from_layer_0_as_llama_cpp_does():
    from meshbench.engine import kv_geometry

    g = kv_geometry.from_metadata(_meta())
    assert [layer.k_values for layer in g.layers] == [4 * 192, 8 * 192, 4 * 192]  # 768 / head_count(0) = 192


@pytest.mark.parametrize(
    "over, expect",
    [
        ({"attention.head_count_kv": [4, 8]}, "has 2 values for 3 layers"),
        ({"attention.head_count": 0}, "head_count is 0"),
        ({"attention.key_length": "64"}, "key_length is '64'"),
        ({"block_count": 10**9}, "block_count is 1000000000"),
        ({"embedding_length": -1}, "embedding_length is -1"),
        ({"attention.head_count_kv": True}, "head_count_kv is True"),
    ],
)
def test_kv_geometry_refuses_metadata_it_cannot_trust(over, expect):
    from meshbench.engine import kv_geometry
    from meshbench.errors import MeshbenchError

    with pytest.raises(MeshbenchError, match=expect):
        kv_geometry.from_metadata(_meta(**over))
