"""`meshbench bench breakdown`: where a tick's time goes on meshbench's GGUF node, level by level.

Each pass is a sweep pass (every session submitted at once, C active) on an engine in this process whose
calls are timed (``GgufEngine.profile``). Per tick, in milliseconds (the pass's totals over its ticks):
- llama_decode for the decode batch, and for prompts;
- logits read and greedy sampling (and per sampled row, in microseconds);
- Python in the engine around those calls (the engine call's time less the above);
- the scheduler and the driver (the tick's time less the engine call's).
Levels alternate within each repetition; each figure is the median over the repetitions, with min..max.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from meshbench.engine import kinds
from meshbench.engine.setup import EngineSetup, close_engine
from meshbench.errors import MeshbenchError
from meshbench.records.endpoint_figures import Spread
from meshbench.scheduler.budget import engine_limits
from meshbench.scheduler.session import GenerationRequest
from meshbench.sweep.passes import run_pass
from meshbench.sweep.plan import level_budget, level_orders
from meshbench.sweep.run import prepare
from meshbench.workload import prompts
from meshbench.workload.config import RunConfig


@dataclass(frozen=True, slots=True, kw_only=True)
class _Pass:
    """One pass's figures, per tick in ms (``sample_us_per_row``: per sampled row, in us)."""

    ticks: int
    tick_ms: float
    decode_llama_ms: float
    prefill_llama_ms: float
    sample_ms: float
    sample_us_per_row: float
    engine_python_ms: float
    scheduler_ms: float
    tokens_per_s: float


@dataclass(frozen=True, slots=True, kw_only=True)
class BreakdownLevel:
    """One level: each figure of its passes, median and range (``ticks``: the first pass's)."""

    concurrency: int
    ticks: int
    tick_ms: Spread
    decode_llama_ms: Spread
    prefill_llama_ms: Spread
    sample_ms: Spread
    sample_us_per_row: Spread
    engine_python_ms: Spread
    scheduler_ms: Spread
    tokens_per_s: Spread


@dataclass(frozen=True, slots=True)
class Breakdown:
    """``meshbench bench breakdown``'s figures (``--json``: this record's fields)."""

    config: str
    model: str | None
    repeat: int
    levels: list[BreakdownLevel]


def run(cfg: RunConfig, levels: list[int], repeat: int, progress: Callable[[str], None] = lambda m: None) -> Breakdown:
    if not kinds.of(cfg.engine.kind).llama or cfg.engine.isolated:
        raise MeshbenchError("bench breakdown needs a gguf engine in meshbench's own process (not isolated)")
    cfg = prompts.apply(cfg)
    setup = prepare(cfg)
    try:
        requests = cfg.workload.requests(setup.vocab_size, setup.eog)
        _pass(cfg, setup, requests, levels[0])  # warm-up: a process's first pass is slower
        samples: dict[int, list[_Pass]] = {c: [] for c in levels}
        for r, order in enumerate(level_orders(len(levels), repeat)):
            for i in order:
                progress(f"repetition {r + 1}/{repeat}, concurrency {levels[i]}")
                samples[levels[i]].append(_pass(cfg, setup, requests, levels[i]))
    finally:
        setup.close()
    return Breakdown(
        config=cfg.source,
        model=getattr(setup.info, "model_name", None) or cfg.engine.model,
        repeat=repeat,
        levels=[_summary(c, samples[c]) for c in levels],
    )


def _pass(cfg: RunConfig, setup: EngineSetup, requests: Sequence[GenerationRequest], c: int) -> _Pass:
    from meshbench.engine.gguf_engine import GgufEngine  # noqa: PLC0415 - llama.cpp's, where it is used
    from meshbench.engine.profile import Profile  # noqa: PLC0415

    budget = level_budget(cfg.budget, c, len(requests))
    engine = setup.make(engine_limits(budget))
    assert isinstance(engine, GgufEngine)  # (run: a gguf engine in this process)
    engine.profile = profile = Profile()
    try:
        p = run_pass(requests, [0] * len(requests), budget, engine, prefill=cfg.prefill)
    finally:
        close_engine(engine)
    ticks = [t for t in p.ticks if t.decode_batch or t.prefill_chunks]
    n = len(ticks)
    tick = sum(t.tick_ns or 0 for t in ticks)
    step = sum((t.decode_ns or 0) + (t.prefill_ns or 0) for t in ticks)
    llama = profile.decode_llama_ns + profile.prefill_llama_ns
    tokens = sum(len(s.tokens) for s in p.sessions)
    return _Pass(
        ticks=n,
        tokens_per_s=tokens / p.wall_s,
        tick_ms=tick / n / 1e6,
        decode_llama_ms=profile.decode_llama_ns / n / 1e6,
        prefill_llama_ms=profile.prefill_llama_ns / n / 1e6,
        sample_ms=profile.sample_ns / n / 1e6,
        engine_python_ms=(step - llama - profile.sample_ns) / n / 1e6,
        scheduler_ms=(tick - step) / n / 1e6,
        sample_us_per_row=profile.sample_ns / max(profile.rows, 1) / 1e3,
    )


def _summary(c: int, passes: list[_Pass]) -> BreakdownLevel:
    """Each figure's median and range over the passes."""

    def over(figure: Callable[[_Pass], float]) -> Spread:
        return Spread.of([figure(p) for p in passes])

    return BreakdownLevel(
        concurrency=c,
        ticks=passes[0].ticks,
        tick_ms=over(lambda p: p.tick_ms),
        decode_llama_ms=over(lambda p: p.decode_llama_ms),
        prefill_llama_ms=over(lambda p: p.prefill_llama_ms),
        sample_ms=over(lambda p: p.sample_ms),
        sample_us_per_row=over(lambda p: p.sample_us_per_row),
        engine_python_ms=over(lambda p: p.engine_python_ms),
        scheduler_ms=over(lambda p: p.scheduler_ms),
        tokens_per_s=over(lambda p: p.tokens_per_s),
    )
