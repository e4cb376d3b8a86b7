"""`meshbench bench gguf`: the GGUF engine through the scheduler against a raw llama_decode loop.

Both sides decode the same batches on fresh contexts of the same model: B sessions,
each prefilled alone, then ``steps`` decode steps of all B. The raw loop fills the
llama_batch, calls llama_decode and takes each row's argmax, with no scheduler. The
scheduler side is the node (NodeDriver) driving GgufEngine; only its full-batch
decode ticks are timed (tick_ns, so the scheduler's own work is inside the timing).
Figures are medians of per-step times over two interleaved rounds of each side.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from meshbench.engine import rpc
from meshbench.engine.base import check_context
from meshbench.engine.gguf_engine import GgufEngine, plain
from meshbench.engine.llama_model import LoadedModel
from meshbench.engine.process import workers
from meshbench.records.context import Budget
from meshbench.scheduler.session import GenerationRequest
from meshbench.sweep.driver import NodeDriver


@dataclass(frozen=True, slots=True, kw_only=True)
class GgufRow:
    """One batch size: per-step medians of the scheduler's and the raw loop's full-batch decode steps."""

    batch: int
    scheduler_tokens_per_s: float
    raw_tokens_per_s: float
    ratio: float  # raw step / scheduler step
    raw_step_ms: float
    scheduler_step_ms: float
    samples: int


@dataclass(frozen=True, slots=True, kw_only=True)
class GgufBench:
    """``meshbench bench gguf``'s figures (``--json``: this record's fields)."""

    model: str
    model_sha256: str
    weight_bytes: int
    prompt_tokens: int
    steps: int
    threads: int | None
    rpc: list[str] | None
    batches: list[GgufRow]


@dataclass(frozen=True, slots=True, kw_only=True)
class OnWorkers:
    """One batch size on one worker count (0: the layers local)."""

    workers: int
    tokens_per_s: float
    step_ms: float
    samples: int


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkersRow:
    batch: int
    on: list[OnWorkers]  # in the order of ``worker_counts``


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkersBench:
    """``meshbench bench gguf --workers``'s figures (``--json``: this record's fields)."""

    model: str
    prompt_tokens: int
    steps: int
    threads: int | None
    rounds: int
    worker_counts: list[int]
    batches: list[WorkersRow]


def _prompts(b: int, prompt: int, vocab: int, seed: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [[int(t) for t in rng.integers(0, vocab, prompt)] for _ in range(b)]


def raw_step_ns(model: LoadedModel, b: int, prompt: int, steps: int, threads: int | None, seed: int) -> list[int]:
    e = GgufEngine(model, b, prompt + steps + 4, plain(model, threads=threads), max_prompt=prompt)
    lib, ctx, batch = e.lib, e.ctx, e.batch
    prompts = _prompts(b, prompt, model.vocab_size, seed)
    last = []
    for s, p in enumerate(prompts):  # prefill each alone, logits on the last token only
        batch.n_tokens = len(p)
        for i, t in enumerate(p):
            batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = t, i, 1, i == len(p) - 1
            batch.seq_id[i][0] = s
        assert lib.llama_decode(ctx, batch) == 0
        last.append(int(np.argmax(np.ctypeslib.as_array(lib.llama_get_logits_ith(ctx, -1), (model.vocab_size,)))))
    batch.n_tokens = b
    for s in range(b):
        batch.n_seq_id[s], batch.seq_id[s][0], batch.logits[s] = 1, s, 1
    times = []
    for step in range(steps + 1):
        t0 = time.perf_counter_ns()
        for s in range(b):
            batch.token[s], batch.pos[s] = last[s], prompt + step
        assert lib.llama_decode(ctx, batch) == 0
        last = [
            int(np.argmax(np.ctypeslib.as_array(lib.llama_get_logits_ith(ctx, s), (model.vocab_size,))))
            for s in range(b)
        ]
        times.append(time.perf_counter_ns() - t0)
    e.close()
    return times[1:]  # the first step is a warm-up


def scheduler_step_ns(model: LoadedModel, b: int, prompt: int, steps: int, threads: int | None, seed: int) -> list[int]:
    # The prompts are prefilled one a tick, so the first session has made b - 1 tokens when the batch is
    # first full: each session asks for b more, and every run has its ``steps`` full-batch ticks (never none).
    e = GgufEngine(model, b, prompt + steps + b + 4, plain(model, threads=threads), max_prompt=prompt)
    budget = Budget(
        weight_bytes=1 << 40,
        kv_bytes=1 << 40,
        scratch_bytes=1 << 40,
        max_active_sessions=b,
        max_queue_depth=0,
        max_batch_size=b,
        max_prefill_tokens_per_tick=prompt,
    )
    sched = NodeDriver(e, budget)
    for i, p in enumerate(_prompts(b, prompt, model.vocab_size, seed)):
        sched.submit(GenerationRequest(f"s{i}", tuple(p), steps + b + 2))
    timed = []
    while sched.has_work():
        rec = sched.run_tick()
        if rec.tick_ns is not None and rec.decode_batch == b and not rec.prefill_sessions and not rec.completed:
            timed.append(rec.tick_ns)
    e.close()
    assert len(timed) > steps, (len(timed), steps)
    return timed[1 : steps + 1]  # the first full-batch tick is the warm-up, as on the raw side


def run(
    model_path: Path,
    batches: list[int],
    prompt: int,
    steps: int,
    threads: int | None,
    seed: int,
    progress: Callable[[str], None] = lambda msg: None,
    endpoints: Sequence[rpc.Endpoint] = (),
) -> GgufBench:
    model = LoadedModel(model_path, "cpu", False, endpoints)
    check_context(prompt + steps + max(batches) + 4, model.n_ctx_train)
    rows = []
    for b in batches:
        progress(f"batch {b}")
        raw: list[float] = []
        sch: list[float] = []
        # Interleaved rounds (raw, scheduler, scheduler, raw) so drift hits both sides alike.
        for first, second in ((raw, sch), (sch, raw)):
            for out in (first, second):
                fn = raw_step_ns if out is raw else scheduler_step_ns
                out += fn(model, b, prompt, steps, threads, seed)
        raw_ms, sch_ms = float(np.median(raw)) / 1e6, float(np.median(sch)) / 1e6
        rows.append(
            GgufRow(
                batch=b,
                scheduler_tokens_per_s=b / sch_ms * 1e3,
                raw_tokens_per_s=b / raw_ms * 1e3,
                ratio=raw_ms / sch_ms,
                raw_step_ms=raw_ms,
                scheduler_step_ms=sch_ms,
                samples=len(raw),
            )
        )
    info = GgufBench(
        model=str(model_path),
        model_sha256=model.sha256,
        weight_bytes=model.weight_bytes,
        prompt_tokens=prompt,
        steps=steps,
        threads=threads,
        rpc=[str(e) for e in endpoints] or None,
        batches=rows,
    )
    model.close()
    return info


def run_workers(
    model_path: Path,
    worker_counts: list[int],
    batches: list[int],
    prompt: int,
    steps: int,
    threads: int | None,
    seed: int,
    rounds: int = 2,
    progress: Callable[[str], None] = lambda msg: None,
) -> WorkersBench:
    """Decode tokens/s through the scheduler with the layers local (0) or on 1, 2, ... spawned RPC workers.

    Rounds alternate the worker counts (0, 1, 2, then 2, 1, 0, ...) so drift hits each alike; each
    configuration loads the model afresh (on its workers), times full-batch decode ticks, frees it.
    """
    samples: dict[int, dict[int, list[int]]] = {w: {b: [] for b in batches} for w in worker_counts}
    for r in range(rounds):
        for w in worker_counts if r % 2 == 0 else list(reversed(worker_counts)):
            progress(f"round {r + 1}: {w} worker(s)")
            with workers.spawned(w, threads) as pool:
                model = LoadedModel(model_path, "cpu", False, pool.endpoints)
                try:
                    check_context(prompt + steps + max(batches) + 4, model.n_ctx_train)
                    for b in batches:
                        samples[w][b] += scheduler_step_ns(model, b, prompt, steps, threads, seed)
                finally:
                    model.close()
    rows = []
    for b in batches:
        on = []
        for w in worker_counts:
            ms = float(np.median(samples[w][b])) / 1e6
            on.append(OnWorkers(workers=w, tokens_per_s=b / ms * 1e3, step_ms=ms, samples=len(samples[w][b])))
        rows.append(WorkersRow(batch=b, on=on))
    return WorkersBench(
        model=str(model_path),
        prompt_tokens=prompt,
        steps=steps,
        threads=threads,
        rounds=rounds,
        worker_counts=worker_counts,
        batches=rows,
    )
