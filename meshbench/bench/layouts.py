"""`meshbench bench layouts`: which matmul layout is fastest for weight x a few activation rows?

The measurement behind ``meshbench.model.llama.linear``: 40 float32 weights of
(2048, 768) (252 MB, more than any cache) times B activation rows, best of 5, per layout.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

from meshbench.model import llama


@dataclass(frozen=True, slots=True)
class LayoutRow:
    """One batch of activation rows: each layout's best ms per pass, by the layout's name."""

    batch: int
    ms: dict[str, float]


@dataclass(frozen=True, slots=True)
class LayoutsBench:
    """``meshbench bench layouts``'s figures (``--json``: this record's fields)."""

    weights: int
    shape: list[int]
    bytes: int
    batches: list[LayoutRow]


def _best_ms(fn: Callable[[], object], repeats: int = 5) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter_ns()
        fn()
        best = min(best, time.perf_counter_ns() - t0)
    return best / 1e6


def _blocks(w: np.ndarray, xt: np.ndarray, n: int = 4) -> np.ndarray:
    step = -(-w.shape[0] // n)
    return np.concatenate([w[i : i + step] @ xt for i in range(0, w.shape[0], step)], axis=0).T


def run(batches: list[int], n_weights: int = 40, shape: tuple[int, int] = (2048, 768), seed: int = 0) -> LayoutsBench:
    rng = np.random.default_rng(seed)
    ws = [rng.standard_normal(shape).astype(np.float32) for _ in range(n_weights)]  # each (out, in)
    nbytes = sum(w.nbytes for w in ws)
    rows = []
    for b in batches:
        x = rng.standard_normal((b, shape[1])).astype(np.float32)  # (B, in)
        xt = np.ascontiguousarray(x.T)  # (in, B)
        layouts = {
            "x @ w.T": lambda: [x @ w.T for w in ws],
            "w @ x.T (contiguous)": lambda: [(w @ np.ascontiguousarray(x.T)).T for w in ws],
            "4 row blocks": lambda: [_blocks(w, xt) for w in ws],
            "einsum": lambda: [np.einsum("oi,bi->bo", w, x) for w in ws],
            "meshbench linear()": lambda: [llama.linear(w, x) for w in ws],
        }
        rows.append(LayoutRow(batch=b, ms={name: _best_ms(fn) for name, fn in layouts.items()}))
    return LayoutsBench(weights=n_weights, shape=list(shape), bytes=nbytes, batches=rows)
