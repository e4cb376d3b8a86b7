"""`meshbench bench engine`: batched decode against a single-session loop and this machine's floor.

Timings are medians of ``repeats`` steps after two warm-up steps. The floor of a decode
step of batch B is max(weight bytes / read bandwidth, B x decode FLOPs / peak FLOP/s),
both ceilings measured in the same run.
"""

from __future__ import annotations

import dataclasses
import os
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np
from numpy.typing import DTypeLike

from meshbench.errors import MeshbenchError
from meshbench.model import llama
from meshbench.model.config import ModelConfig
from meshbench.model.config import preset as get_preset
from meshbench.model.kv import HotKvStateManager
from meshbench.model.weights import Weights, init_weights

GIB = 1 << 30


def _median_ms(fn: Callable[[], object], repeats: int, warmup: int = 2) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter_ns()
        fn()
        times.append(time.perf_counter_ns() - t0)
    return float(np.median(times)) / 1e6


def read_bandwidth_gb_s(nbytes: int = GIB, repeats: int = 3) -> float:
    """Best of ``repeats`` read-only passes (a max-reduction) over an array of ``nbytes``."""
    a = np.ones(nbytes // 4, dtype=np.float32)  # (n,)
    best = float("inf")
    for _ in range(repeats + 1):
        t0 = time.perf_counter_ns()
        a.max()
        best = min(best, time.perf_counter_ns() - t0)
    return nbytes / best  # bytes per ns == GB/s


def peak_gflop_s(dtype: DTypeLike, n: int = 2048, repeats: int = 3) -> float:
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n)).astype(dtype)  # (n, n)
    b = rng.standard_normal((n, n)).astype(dtype)  # (n, n)
    a @ b
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter_ns()
        a @ b
        best = min(best, time.perf_counter_ns() - t0)
    return 2 * n**3 / best  # FLOP per ns == GFLOP/s


def run(
    preset: str,
    batches: list[int],
    context: int,
    repeats: int,
    seed: int,
    progress: Callable[[str], None] = lambda msg: None,
) -> EngineBench:
    cfg = get_preset(preset)
    if context + repeats + 2 > cfg.context_length:
        raise MeshbenchError(f"--context {context}: exceeds the preset's context_length {cfg.context_length}")
    progress(f"measuring this machine's ceilings (1 GiB read, {cfg.dtype} matmul)")
    bandwidth = read_bandwidth_gb_s()
    peak = peak_gflop_s(cfg.np_dtype)
    progress(f"building preset {preset}: {cfg.n_params / 1e6:.1f}M parameters")
    w = init_weights(cfg, seed)
    weight_bytes = w.nbytes
    flops = cfg.decode_flops_per_token()
    kv = HotKvStateManager(cfg.n_layers, cfg.n_kv_heads, cfg.head_dim, cfg.np_dtype, 1 << 40)
    rng = np.random.default_rng(seed)
    rows = []
    for b in batches:
        progress(f"batch {b}")
        rows.append(_batch_row(cfg, w, kv, rng, b, context, repeats, max(weight_bytes / bandwidth, b * flops / peak)))
    one = next((r for r in rows if r.batch == 1), rows[0])
    return EngineBench(
        preset=preset,
        params=cfg.n_params,
        dtype=cfg.dtype,
        weight_bytes=weight_bytes,
        decode_flops_per_token=flops,
        context=context,
        repeats=repeats,
        threads=os.cpu_count(),
        bandwidth_gb_s=bandwidth,
        peak_gflop_s=peak,
        batches=[dataclasses.replace(r, speedup_vs_batch1=r.tokens_per_s / one.tokens_per_s) for r in rows],
    )


@dataclass(frozen=True, slots=True)
class BatchRow:
    """One batch size: a batched decode step against the same sessions one at a time, and this machine's floor."""

    batch: int
    step_ms: float
    tokens_per_s: float
    loop_step_ms: float
    loop_tokens_per_s: float
    floor_ms: float
    step_over_floor: float
    speedup_vs_batch1: float | None = None  # tokens/s over batch 1's (or the first batch's), once every batch ran


@dataclass(frozen=True, slots=True)
class EngineBench:
    """``meshbench bench engine``'s figures (``--json``: this record's fields)."""

    preset: str
    params: int
    dtype: str
    weight_bytes: int
    decode_flops_per_token: float
    context: int
    repeats: int
    threads: int | None
    bandwidth_gb_s: float
    peak_gflop_s: float
    batches: list[BatchRow]


def _batch_row(
    cfg: ModelConfig,
    w: Weights,
    kv: HotKvStateManager,
    rng: np.random.Generator,
    b: int,
    context: int,
    repeats: int,
    floor_ns: float,
) -> BatchRow:
    """One batch size: a decode step of ``b`` warm sessions batched, and the same ``b`` one at a time."""
    slots = []
    for i in range(b):
        s = kv.open(f"b{b}s{i}", 0, cfg.context_length)
        s.k[:, :context] = rng.standard_normal(s.k[:, :context].shape).astype(cfg.np_dtype)
        s.v[:, :context] = rng.standard_normal(s.v[:, :context].shape).astype(cfg.np_dtype)
        s.length = context  # a warm cache: timing depends on its length, not its contents
        slots.append(s)
    tokens = [int(t) for t in rng.integers(0, cfg.vocab_size, b)]
    step_ms = _median_ms(lambda: llama.decode(cfg, w, slots, tokens), repeats)
    loop_ms = _median_ms(lambda: [llama.decode(cfg, w, [s], [t]) for s, t in zip(slots, tokens)], repeats)
    for i in range(b):
        kv.release(f"b{b}s{i}")
    floor_ms = floor_ns / 1e6
    return BatchRow(
        batch=b,
        step_ms=step_ms,
        tokens_per_s=b / (step_ms / 1e3),
        loop_step_ms=loop_ms,
        loop_tokens_per_s=b / (loop_ms / 1e3),
        floor_ms=floor_ms,
        step_over_floor=step_ms / floor_ms,
    )
