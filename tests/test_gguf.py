"""The GGUF engine on llama.cpp: tiny models made here, parity, batch invariance, one decode per tick."""

import json
from pathlib import Path

import numpy as np
import pytest

llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python is not importable: the GGUF engine is untested")

import factories as f  # noqa: E402
from test_model import GOLDEN_DGR012  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from meshbench.cli import app  # noqa: E402
from meshbench.engine.base import DecodeItem, PrefillChunk, SessionHandle, separate_step  # noqa: E402
from meshbench.engine.gguf_engine import GgufEngine, plain  # noqa: E402
from meshbench.engine.llama_model import LoadedModel  # noqa: E402
from meshbench.engine.synthetic import SyntheticEngine  # noqa: E402
from meshbench.model import gguf_io  # noqa: E402

runner = CliRunner()
# Logit tolerance per llama.cpp KV type, on the F32 model with flash attention off.
# Measured here (the test prints it with -s): 6.2e-6 with an F32 KV cache, 5.5e-3 with F16.
PARITY_ATOL = {"f32": 1e-4, "f16": 2e-2}


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("models")
    out = {}
    for t in ("f32", "q8_0", "q4_0"):
        p = d / f"tiny-{t}.gguf"
        r = runner.invoke(app, ["model", "make-tiny", str(p), "--type", t])
        assert r.exit_code == 0, r.output
        out[t] = p
    return out


@pytest.fixture(scope="module")
def loaded(models):
    cache = {t: LoadedModel(p, "cpu", verbose=False) for t, p in models.items()}
    yield cache
    for m in cache.values():
        m.close()


def _run(engine, prompts: dict, steps: int, batched: bool = True):
    """Prefill each prompt alone, then decode all sessions together (or one at a time)."""
    toks = {}
    for sid, p in prompts.items():
        toks[sid] = [engine.prefill(SessionHandle(sid, 0, len(p) + steps + 1), p).token]
    for step in range(steps):
        items = [DecodeItem(sid, 0, len(p) + step, toks[sid][-1]) for sid, p in prompts.items()]
        results = engine.decode_batch(items) if batched else [engine.decode_batch([it])[0] for it in items]
        for it, r in zip(items, results):
            toks[it.session_id].append(r.token)
    return toks


def test_make_tiny_round_trips_the_synthetic_weights(models):
    cfg, w = f.weights()
    cfg2, w2 = gguf_io.read_weights(models["f32"])
    assert (cfg2.dim, cfg2.n_layers, cfg2.n_heads, cfg2.n_kv_heads, cfg2.ffn_dim, cfg2.vocab_size) == (
        cfg.dim,
        cfg.n_layers,
        cfg.n_heads,
        cfg.n_kv_heads,
        cfg.ffn_dim,
        cfg.vocab_size,
    )
    for (n1, a), (n2, b) in zip(w.named_tensors(), w2.named_tensors()):
        assert n1 == n2 and a.shape == b.shape
        np.testing.assert_array_equal(a.astype(np.float32), b)
    _, wq = gguf_io.read_weights(models["q8_0"])
    dev = float(np.max(np.abs(wq.layers[0].w_up - w.layers[0].w_up)))
    assert 0 < dev < 0.02, f"q8_0 dequantization deviates by {dev}"


def test_llama_cpp_reproduces_the_golden_stream_on_the_f32_model(loaded):
    e = GgufEngine(loaded["f32"], 1, 32, plain(loaded["f32"], threads=2, kv_type="f32"))
    toks = _run(e, {"g": [1, 2, 3, 4]}, 15)
    assert toks["g"] == GOLDEN_DGR012


@pytest.mark.parametrize("kv_type", ["f32", "f16"])
def test_cross_engine_parity_on_f32_weights(loaded, models, monkeypatch, kv_type):
    import meshbench.engine.synthetic as se

    seen = {"gguf": {}, "numpy": {}}  # every sampled row, per session, prefill and decode alike
    inner = se.greedy_step

    def capture(sid, logits, banned=None):
        seen["numpy"].setdefault(sid, []).append(np.array(logits, dtype=np.float64))
        return inner(sid, logits, banned)

    monkeypatch.setattr(se, "greedy_step", capture)
    cfg, w = gguf_io.read_weights(models["f32"])
    prompts = {"a": [1, 2, 3, 4], "b": [9], "c": [5, 6, 7, 8, 9, 10, 11]}
    engine = GgufEngine(loaded["f32"], 4, 64, plain(loaded["f32"], threads=2, kv_type=kv_type))
    engine.tap = lambda sid, row: seen["gguf"].setdefault(sid, []).append(np.array(row, dtype=np.float64))
    t_gguf = _run(engine, prompts, 10)
    t_numpy = _run(SyntheticEngine(cfg, w, 1 << 30), prompts, 10)
    assert t_gguf == t_numpy
    assert {sid: len(r) for sid, r in seen["gguf"].items()} == {sid: 11 for sid in prompts}
    dev = max(float(np.max(np.abs(a - b))) for sid in prompts for a, b in zip(seen["gguf"][sid], seen["numpy"][sid]))
    print(f"\nparity, F32 weights, {kv_type} KV cache: max |logit diff| llama.cpp vs numpy = {dev:.3g}")
    tol = PARITY_ATOL[kv_type]
    assert dev < tol, f"llama.cpp and numpy logits differ by {dev:.3e} (tolerance {tol})"


def test_cross_engine_sweeps_give_identical_tokens_on_dgr012(models):
    args = ["sweep", "--model", str(models["f32"]), "--json"]
    g = json.loads(runner.invoke(app, args + ["--engine", "gguf"]).stdout)
    s = json.loads(runner.invoke(app, args + ["--engine", "synthetic"]).stdout)
    assert g["corruption_free"] and s["corruption_free"]
    for lg, ls in zip(g["levels"], s["levels"]):
        assert [x["digest"] for x in lg["sessions"]] == [x["digest"] for x in ls["sessions"]]
        assert (lg["ticks"], lg["max_batch_occupancy"]) == (ls["ticks"], ls["max_batch_occupancy"])


@pytest.mark.parametrize("qtype", ["q8_0", "q4_0"])
def test_quantized_batch_1_and_batch_8_logits_are_bitwise_identical(loaded, monkeypatch, qtype):

    seen: dict[str, list] = {"batched": [], "single": []}  # every sampled row: prefill and decode

    def run(tag: str, batched: bool):
        engine = GgufEngine(loaded[qtype], 8, 64, plain(loaded[qtype], threads=2))
        engine.tap = lambda sid, row: seen[tag].append((sid, np.array(row)))
        return _run(engine, prompts, 12, batched=batched)

    rng = np.random.default_rng(7)
    prompts = {f"s{i}": [int(t) for t in rng.integers(0, 256, 2 + 5 * i)] for i in range(8)}
    t_b = run("batched", True)
    t_s = run("single", False)
    assert t_b == t_s
    assert len(seen["batched"]) == len(seen["single"]) == 8 * 13
    by_sid = lambda rows: {sid: [x for s, x in rows if s == sid] for sid in prompts}  # noqa: E731
    b, s = by_sid(seen["batched"]), by_sid(seen["single"])
    for sid in prompts:
        for i, (x, y) in enumerate(zip(b[sid], s[sid])):
            assert np.array_equal(x, y), f"{qtype} {sid} step {i}: max |diff| {float(np.max(np.abs(x - y))):.3e}"


def test_each_tick_is_one_llama_decode_for_the_whole_batch(loaded):
    e = GgufEngine(loaded["q8_0"], 4, 32, plain(loaded["q8_0"], threads=2))

    class Counting:
        def __init__(self, inner):
            self.inner, self.decodes = inner, []

        def __getattr__(self, name):
            return getattr(self.inner, name)

        def step(self, decode, prefill):  # the tick's call, through this wrapper's own methods
            return separate_step(self, decode, prefill)

        def llama_decode(self, ctx, batch):
            self.decodes.append(batch.n_tokens)
            return self.inner.llama_decode(ctx, batch)

    e.lib = Counting(e.lib)
    toks = {sid: e.prefill(SessionHandle(sid, 0, 20), [1, 2, 3]).token for sid in "abcd"}
    assert e.lib.decodes == [3, 3, 3, 3]  # each prompt in one call
    e.decode_batch([DecodeItem(sid, 0, 3, toks[sid]) for sid in "abcd"])
    assert e.lib.decodes[4:] == [4]  # the whole batch in ONE llama_decode
    assert e.kv_bytes_in_use == 4 * 4 * e.kv_bytes_per_token


def test_release_removes_the_sequence_and_a_stale_decode_is_a_miss(loaded):
    e = GgufEngine(loaded["q8_0"], 2, 32, plain(loaded["q8_0"], threads=2))
    r = e.prefill(SessionHandle("a", 0, 20), [1, 2, 3])
    seq_id = e._seq_ids["a"]
    assert llama_cpp.llama_memory_seq_pos_max(e.mem, seq_id) == 2
    e.release("a")
    assert llama_cpp.llama_memory_seq_pos_max(e.mem, seq_id) == -1
    assert e.kv_bytes_in_use == 0
    (res,) = e.decode_batch([DecodeItem("a", 0, 3, r.token)])
    assert res.cache_miss and res.token is None


def test_kv_bytes_per_token_comes_from_the_model_metadata(loaded):
    cfg, _ = f.weights()
    m = loaded["q8_0"]
    assert (
        GgufEngine(m, 1, 16, plain(m, threads=1, kv_type="f16")).kv_bytes_per_token == 2 * cfg.n_layers * cfg.kv_dim * 2
    )
    assert (
        GgufEngine(m, 1, 16, plain(m, threads=1, kv_type="f32")).kv_bytes_per_token == 2 * cfg.n_layers * cfg.kv_dim * 4
    )
    assert m.weight_bytes > 0


def _cli(*args):
    return runner.invoke(app, [str(a) for a in args])


def test_bad_model_files_get_one_clear_line(tmp_path, models):
    notgguf = tmp_path / "x.gguf"
    notgguf.write_bytes(b"PK\x03\x04 not a model")
    truncated = tmp_path / "t.gguf"
    truncated.write_bytes(models["q8_0"].read_bytes()[:5000])
    cases = {
        tmp_path / "missing.gguf": "no such file",
        tmp_path: "is a directory",
        notgguf: "not a GGUF file",
        truncated: "truncated",
    }
    for path, expected in cases.items():
        r = _cli("sweep", "--engine", "gguf", "--model", path)
        assert r.exit_code == 2, (path, r.output)
        assert expected in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_an_architecture_llama_cpp_cannot_run_is_refused(tmp_path):
    import gguf

    p = tmp_path / "alien.gguf"
    w = gguf.GGUFWriter(str(p), "no-such-arch")
    w.add_tensor("x.weight", np.zeros((32, 32), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    r = _cli("sweep", "--engine", "gguf", "--model", p)
    assert r.exit_code == 2 and "no-such-arch" in r.stderr, r.output


def test_device_cuda_without_a_gpu_backend_is_refused(models):
    from meshbench.engine import rpc

    if rpc.has_gpu_device():
        pytest.skip("this llama.cpp sees a GPU")
    r = _cli("sweep", "--engine", "gguf", "--model", models["q8_0"], "--device", "cuda")
    assert r.exit_code == 2 and "no GPU backend" in r.stderr


def test_gguf_sweep_is_corruption_free_and_recorded(models, tmp_path):
    out = tmp_path / "bundle"
    r = _cli("sweep", "--engine", "gguf", "--model", models["q8_0"], "--threads", "2", "--out", out)
    assert r.exit_code == 0, r.output
    data = json.loads((out / "results.json").read_text())
    assert data["corruption_free"] and data["engine"]["kind"] == "gguf"
    assert data["engine"]["kv_bytes_per_token"] == 384  # F16 KV: 2 x 3 layers x 32 x 2 bytes
    assert [lv["peak_kv_bytes"] for lv in data["levels"]] == [3840, 7296, 13056, 18816]
    assert _cli("verify", out, "--rerun").exit_code == 0


def test_a_divergence_on_a_near_tie_is_classified_as_kernel_variance(models):
    import dataclasses

    from meshbench.analysis.divergence import NEAR_TIE, classify
    from meshbench.records import serial
    from meshbench.records.documents import FirstDivergence, SweepIsolation
    from meshbench.sweep import prove
    from meshbench.sweep.run import run_sweep
    from meshbench.workload import config

    cfg = config.load(overrides={"engine": {"kind": "gguf", "model": str(models["q8_0"])}, "levels": [1, 8]})
    div = FirstDivergence(
        session_id="s0",
        token_index=3,
        reference_concurrency=1,
        concurrency=8,
        reference_token=1,
        token=2,
        reference_margin=1e-4,
    )
    isolation = SweepIsolation(method="m", levels_run=2, every_level=True, holds=True)
    bundle = Path(__file__).resolve().parents[1] / "evidence" / "DGR-012-gguf"
    recorded = json.loads((bundle / "results.json").read_text())["engine"]
    llama = serial.engine_info(recorded)  # (a llama-architecture model's engine record)
    assert llama.architecture == "llama"
    oracle = prove.oracle(cfg, div, llama, lambda c: run_sweep(c, "test"))
    assert oracle == "agrees across levels [1, 8] on the same weights"
    text = classify(div, isolation, oracle)
    assert text.startswith("engine batch variance (shape-dependent numerics)") and "(a near-tie)" in text
    assert text.endswith("numpy oracle: agrees across levels [1, 8] on the same weights")
    far = dataclasses.replace(div, reference_margin=10 * NEAR_TIE)
    assert "near-tie" not in classify(far, isolation, oracle)
    leaked = dataclasses.replace(isolation, holds=False)
    assert classify(far, leaked, oracle).startswith("contamination between sessions")
    unproven = dataclasses.replace(isolation, holds=None, every_level=False)
    assert classify(far, unproven, oracle).startswith("unclassified")


def test_values_that_would_crash_llama_cpp_are_refused_before_it_sees_them(models, loaded, tmp_path):
    from test_bad_input import run_refused

    from meshbench.errors import MeshbenchError

    m = models["q8_0"]
    run_refused("bench", "gguf", "--model", m, "--prompt-tokens", "600", expect="context length is 512")
    run_refused("bench", "gguf", "--model", m, "--batches", "1,300", expect="300 is above the maximum 256")
    run_refused(
        "sweep",
        "--engine",
        "gguf",
        "--model",
        m,
        "--sessions",
        "300",
        "--levels",
        "1,300",
        expect="concurrency 300: a llama.cpp context holds at most 256 sequences",
        cwd_files=tmp_path,
    )
    with pytest.raises(MeshbenchError, match="llama.cpp takes 1 to 512 threads"):
        GgufEngine(loaded["q8_0"], 1, 16, plain(loaded["q8_0"], threads=100_000))


def test_a_gguf_with_non_finite_weights_is_refused_by_the_gguf_engine(tmp_path):
    import gguf
    from test_bad_input import run_refused

    cfg, w = f.weights()
    p = tmp_path / "nan.gguf"
    gguf_io.write(p, cfg, w, "q4_0")
    reader = gguf.GGUFReader(p, "r+")
    t = next(t for t in reader.tensors if t.name == "output.weight")
    t.data.view(np.uint8).reshape(-1)[:2] = np.frombuffer(np.float16(np.inf).tobytes(), np.uint8)
    del reader, t
    run_refused("sweep", "--engine", "gguf", "--model", p, expect="tensor output.weight holds 1 non-finite values")


def test_a_tick_over_llama_cpps_micro_batch_is_computed_in_pieces_of_it(loaded):
    """n_ubatch is llama.cpp's own default (512) where a tick may be larger: one llama_decode, computed in pieces of
    512 as llama-server's, the compute buffer bounded by them; up to it a tick is one piece, as before."""
    small = GgufEngine(loaded["q8_0"], 4, 64, plain(loaded["q8_0"], threads=2, mixed_batch=True), max_prompt=32)
    assert small.n_batch == small.n_ubatch == 36
    small.close()
    e = GgufEngine(loaded["q8_0"], 3, 504, plain(loaded["q8_0"], threads=2, mixed_batch=True), max_prompt=500)
    assert e.n_batch == e.n_ubatch == 503
    e.close()
    e = GgufEngine(loaded["q8_0"], 16, 504, plain(loaded["q8_0"], threads=2, mixed_batch=True), max_prompt=500)
    assert (e.n_batch, e.n_ubatch) == (516, 512)
    toks = {sid: e.prefill(SessionHandle(sid, 0, 504), [1 + i, 2, 3]).token for i, sid in enumerate("ab")}
    long = [(7 * i) % 200 + 1 for i in range(500)]
    out = e.step(
        [DecodeItem(sid, 0, 3, toks[sid]) for sid in "ab"],
        [PrefillChunk(SessionHandle("c", 0, 504), tuple(long), 0, True)],
    )
    assert all(r.token is not None for r in out.decode) and out.prefill[0].token is not None  # 502 rows, in 2 pieces
    alone = GgufEngine(loaded["q8_0"], 1, 504, plain(loaded["q8_0"], threads=2), max_prompt=500)
    assert alone.prefill(SessionHandle("c", 0, 504), long).token == out.prefill[0].token
    alone.close()
    e.close()


def test_engine_n_ubatch_sets_llama_cpp_s_micro_batch_from_the_flag_to_the_recorded_recipe(loaded, models, tmp_path):
    """A real engine setting declared once (engine.spec): its flag, its schema and the engine that acts on it. Eight
    sessions decoded in pieces of 2 rows give the recipe another fingerprint, and a sweep given --ubatch records it
    in its config echo and verifies."""
    m = loaded["q8_0"]
    prompts = {f"s{i}": [1 + i, 7, 3 + i, 9] for i in range(8)}
    whole = GgufEngine(m, 8, 32, plain(m, threads=2))
    pieces = GgufEngine(m, 8, 32, plain(m, threads=2, n_ubatch=2))
    try:
        assert (whole.n_ubatch, pieces.n_ubatch) == (512, 2)  # (llama.cpp's own 512, the batch being 512)
        assert whole.recipe_fingerprint != pieces.recipe_fingerprint
        assert _run(whole, prompts, 4).keys() == _run(pieces, prompts, 4).keys()
    finally:
        whole.close()
        pieces.close()
    out = tmp_path / "U"
    args = ["sweep", "--engine", "gguf", "--model", str(models["q8_0"]), "--levels", "1,2", "--sessions", "2"]
    r = runner.invoke(app, [*args, "--new-tokens", "3", "--ubatch", "2", "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert json.loads((out / "results.json").read_text())["config"]["engine"]["n_ubatch"] == 2
    assert runner.invoke(app, ["verify", str(out)]).exit_code == 0
    bad = runner.invoke(app, [*args, "--ubatch", "0"])
    assert bad.exit_code == 2 and "--ubatch" in bad.output


def test_the_numpy_oracle_runs_a_gguf_sweep_s_weights_without_its_llama_cpp_settings(models):
    """Every setting the synthetic engine has not (llama.cpp's micro-batch, repacking, tiled matmul, RPC, ...) is
    at its default in the oracle's spec, whichever settings a later meshbench adds (a GGUF sweep given --ubatch
    used to lose its oracle: the synthetic spec refused the micro-batch)."""
    from meshbench.engine import spec as spec_mod
    from meshbench.engine.spec import EngineSpec
    from meshbench.sweep.prove import as_synthetic

    gguf = EngineSpec(kind="gguf", model=str(models["q8_0"]), n_ubatch=2, tiled_mm="off", mixed_batch=True, threads=2)
    numpy = as_synthetic(gguf)
    assert numpy.kind == "synthetic" and numpy.model == gguf.model and numpy.threads == 2
    for setting in spec_mod.settings():
        if "synthetic" not in setting.metadata["kinds"]:
            assert getattr(numpy, setting.name) == setting.default, setting.name
