"""`meshbench bench invariance`: up to which batch size are llama.cpp's logits bitwise those of batch 1?

Per recipe (weight repacking x flash attention x kv_unified, and ggml's tiled K-quant matmul switch),
sessions with prompts of 4 to 32 tokens are each prefilled alone; then, for every batch size B, the
first B sessions decode together (one llama_decode per step) and every step's logits are compared with
the same sessions decoding alone. Reported: the largest B up to which every tested size is bitwise
equal, the first that is not, the largest |logit difference| and at which step, and decode tokens/s
at batch 1, 8 and 16.

Repacking is a model-load setting and the tiled switch a process-wide environment variable, so each
(repack, tiled_mm) pair runs in a process of its own: one that dies (llama.cpp's AMX kernels raise
SIGILL on CPUs that report AMX but cannot run it) takes only its own recipes with it.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from meshbench import files
from meshbench.engine.llama_model import LoadedModel
from meshbench.engine.process.proxy import child_environment
from meshbench.model import gguf_io

BATCHES = (1, 2, 4, 6, 7, 8, 12, 16, 24, 32, 48, 64)
CONTEXTS: tuple[tuple[str, dict[str, bool]], ...] = (
    ("default", {}),
    ("flash_attn", {"flash_attn": True}),
    ("kv_unified", {"kv_unified": True}),
    ("flash_attn+kv_unified", {"flash_attn": True, "kv_unified": True}),
)
# (repack, tiled_mm) groups, each in its own process; the contexts above run in each of the first two,
# the tiled switch with the default context only.
GROUPS = (
    (False, "auto", [c for c, _ in CONTEXTS]),
    (True, "auto", [c for c, _ in CONTEXTS]),
    (False, "off", ["default"]),
    (False, "force", ["default"]),
)
CHILD_TIMEOUT_S = 3600


@dataclass(frozen=True, slots=True, kw_only=True)
class BatchCompare:
    """Batch ``batch``'s logits against each session's decoded alone, step by step."""

    batch: int
    bitwise: bool
    max_abs_logit_diff: float
    first_differing_step: int | None
    diff_at_first_differing_step: float | None  # (the kernels' own: every stream was still fed the same tokens)
    tokens_identical: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class Measured:
    largest_invariant_batch: int
    first_variant_batch: int | None
    per_batch: list[BatchCompare]
    decode_tokens_per_s: dict[int, float]  # by batch (1, 8, 16 where measured)

    @staticmethod
    def parse(d: dict[str, Any]) -> Measured:
        """From the JSON a recipe's child process printed."""
        return Measured(
            largest_invariant_batch=d["largest_invariant_batch"],
            first_variant_batch=d["first_variant_batch"],
            per_batch=[BatchCompare(**x) for x in d["per_batch"]],
            decode_tokens_per_s={int(b): r for b, r in d["decode_tokens_per_s"].items()},
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Recipe:
    """One recipe and context: measured, or the error its process ended with."""

    repack: bool
    tiled_mm: str
    context: str
    error: str | None = None
    measured: Measured | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class InvarianceBench:
    """``meshbench bench invariance``'s figures (``--json``: this record's fields)."""

    model: str
    batches: list[int]
    steps: int
    threads: int | None
    seed: int
    recipes: list[Recipe]


def run(
    model_path: Path,
    batches: Sequence[int],
    steps: int,
    threads: int | None,
    seed: int,
    progress: Callable[[str], None] = lambda msg: None,
) -> InvarianceBench:
    gguf_io.check_model_file(files.regular_file(str(model_path), "--model"))  # once, before any recipe's process
    recipes = []
    for repack, tiled, contexts in GROUPS:
        progress(f"repack {'on' if repack else 'off'}, tiled_mm {tiled}: {', '.join(contexts)}")
        recipes += _group(model_path, repack, tiled, contexts, batches, steps, threads, seed)
    return InvarianceBench(
        model=str(model_path), batches=list(batches), steps=steps, threads=threads, seed=seed, recipes=recipes
    )


def _group(
    model_path: Path,
    repack: bool,
    tiled: str,
    contexts: list[str],
    batches: Sequence[int],
    steps: int,
    threads: int | None,
    seed: int,
) -> list[Recipe]:
    args = json.dumps(
        {
            "model": str(model_path),
            "repack": repack,
            "tiled_mm": tiled,
            "contexts": contexts,
            "batches": list(batches),
            "steps": steps,
            "threads": threads,
            "seed": seed,
        }
    )
    try:
        done = subprocess.run(
            [sys.executable, "-m", "meshbench.bench.invariance", args],
            capture_output=True,
            text=True,
            env=child_environment(tiled),
            stdin=subprocess.DEVNULL,
            timeout=CHILD_TIMEOUT_S,
        )
        code, text = done.returncode, done.stdout
    except subprocess.TimeoutExpired:
        code, text = None, ""
    if code == 0:
        return [
            Recipe(repack=repack, tiled_mm=tiled, context=c, measured=Measured.parse(m))
            for c, m in zip(contexts, json.loads(text), strict=True)
        ]
    why = (
        f"timed out after {CHILD_TIMEOUT_S} s"
        if code is None
        else f"died with {signal.Signals(-code).name}"
        if code < 0
        else f"exited {code}"
    )
    return [Recipe(repack=repack, tiled_mm=tiled, context=c, error=why) for c in contexts]


def _measure(
    model: LoadedModel, context: dict[str, bool], batches: Sequence[int], steps: int, threads: int | None, seed: int
) -> Measured:
    from meshbench.engine.base import DecodeItem, SessionHandle  # noqa: PLC0415 - the child's imports
    from meshbench.engine.gguf_engine import GgufEngine, plain  # noqa: PLC0415

    n = max(batches)
    rng = np.random.default_rng(seed)
    prompts = [[int(t) for t in rng.integers(0, model.vocab_size, int(k))] for k in rng.integers(4, 33, n)]
    capacity = max(map(len, prompts)) + steps + 1

    def decode(group: Sequence[int]) -> tuple[dict[int, list[np.ndarray]], float]:
        """The sessions ``group`` prefilled alone, then decoded together: each step's logits, and the time."""
        e = GgufEngine(model, len(group), capacity, plain(model, threads=threads, **context), max_prompt=capacity)
        rows: dict[int, list[np.ndarray]] = {i: [] for i in group}
        try:
            first = {i: e.prefill(SessionHandle(f"s{i}", 0, capacity), prompts[i]).token for i in group}
            last = {i: t for i, t in first.items() if t is not None}
            assert len(last) == len(first), "a prefill gave no token"
            e.tap = lambda sid, row: rows[int(sid[1:])].append(row)
            t0 = time.perf_counter()
            for step in range(steps):
                items = [DecodeItem(f"s{i}", 0, len(prompts[i]) + step, last[i]) for i in group]
                for i, r in zip(group, e.decode_batch(items)):
                    assert r.token is not None, r.error
                    last[i] = r.token
            return rows, time.perf_counter() - t0
        finally:
            e.close()

    alone, alone_s = {}, 0.0
    for i in range(n):
        rows, s = decode([i])
        alone[i] = rows[i]
        alone_s += s
    per_batch, rates = [], {1: n * steps / alone_s}
    for b in batches:
        rows, s = decode(list(range(b))) if b > 1 else (alone, alone_s)
        per_batch.append(_compare_batch(b, rows, alone))
        if b > 1:
            rates[b] = b * steps / s
    largest = 0
    for r in per_batch:
        if not r.bitwise:
            break
        largest = r.batch
    return Measured(
        largest_invariant_batch=largest,
        first_variant_batch=next((r.batch for r in per_batch if not r.bitwise), None),
        per_batch=per_batch,
        decode_tokens_per_s={b: rates[b] for b in (1, 8, 16) if b in rates},
    )


def _compare_batch(b: int, rows: dict[int, list[np.ndarray]], alone: dict[int, list[np.ndarray]]) -> BatchCompare:
    """Batch ``b``'s logits against each session's alone, step by step."""
    diffs = [[float(np.max(np.abs(x - y))) for x, y in zip(rows[i], alone[i])] for i in range(b)]
    worst = max((max(d) for d in diffs), default=0.0)
    first = min((k for d in diffs for k, v in enumerate(d) if v > 0), default=None)
    # at the first step that differs the sessions were still fed the same tokens: that difference is the
    # kernels'; later steps may compare streams that already took different tokens
    at_first = None if first is None else max(d[first] for d in diffs)
    return BatchCompare(
        batch=b,
        bitwise=worst == 0.0,
        max_abs_logit_diff=worst,
        first_differing_step=first,
        diff_at_first_differing_step=at_first,
        tokens_identical=all(
            int(np.argmax(x)) == int(np.argmax(y)) for i in range(b) for x, y in zip(rows[i], alone[i])
        ),
    )


def _child(args: dict[str, Any]) -> None:
    """One (repack, tiled_mm) group in this process: every context's measurement, in order, as JSON on stdout."""
    from meshbench.engine.llama_model import LoadedModel  # noqa: PLC0415

    model = LoadedModel(Path(args["model"]), "cpu", False, repack=args["repack"])
    contexts = dict(CONTEXTS)
    out = []
    for name in args["contexts"]:
        out.append(
            asdict(_measure(model, contexts[name], args["batches"], args["steps"], args["threads"], args["seed"]))
        )
    model.close()
    print(json.dumps(out))


if __name__ == "__main__":
    _child(json.loads(sys.argv[1]))
