"""The concurrency sweep: the same jobs at every level, a fresh engine per pass.

At level c the node allows c active sessions and a batch of c; every job is submitted
before the first tick and the queue holds them all. A sweep runs ``warmup`` unrecorded
passes of every level, then ``repeat`` recorded ones, repetition by repetition with the
level order rotated each time. Each level becomes the record results.json holds: the
deterministic records of its first repetition (which every other repetition must equal)
and every repetition's raw timing, with the figures ``meshbench.figures`` computes from them.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass
from typing import Callable, Sequence

from meshbench import figures
from meshbench.config import Workload, validate_levels
from meshbench.engine.base import BatchEngine
from meshbench.scheduler.budget import NodeBudget
from meshbench.scheduler.scheduler import ContinuousBatchScheduler
from meshbench.scheduler.session import GenerationRequest, Session
from meshbench.scheduler.telemetry import TickRecord

# Per-level counts the scheduler reports beside the tick figures; with figures.TICK_FIGURES
# and the level's concurrency, every deterministic per-level field of results.json.
LEVEL_COUNTS = ("rejected_admissions", "cache_misses", "failed")
DETERMINISTIC_LEVEL_FIELDS = ("concurrency", *figures.TICK_FIGURES, *LEVEL_COUNTS)


@dataclass(slots=True)
class ConcurrencySweep:
    levels: list[dict]  # one results.json level record each
    corruption_free: bool
    first_divergence: dict | None
    saturation_concurrency: int
    reference_concurrency: int


def _finite(x):
    """JSON has no inf/nan: a margin that is not finite is recorded as null."""
    return x if isinstance(x, (int, float)) and math.isfinite(x) else None


def session_record(s: Session) -> dict:
    """A session's deterministic record, as results.json holds it."""
    return {
        "session_id": s.session_id, "prompt_tokens": s.prompt_len, "max_new_tokens": s.request.max_new_tokens,
        "tokens": list(s.tokens), "margins": [_finite(m) for m in s.margins],
        "digest": figures.token_digest(s.tokens),
        "done_reason": s.done_reason.value if s.done_reason else "UNFINISHED", "error": s.error,
    }


def session_timing(s: Session, t0: int) -> dict:
    """A session's stamps in one repetition, relative to the start of that pass."""
    return {"session_id": s.session_id, "digest": figures.token_digest(s.tokens),
            "done_reason": s.done_reason.value if s.done_reason else "UNFINISHED",
            "submit_ns": s.submit_ns - t0, "admit_ns": None if s.admit_ns is None else s.admit_ns - t0,
            "token_ns": [t - t0 for t in s.token_ns]}


def level_budget(base: NodeBudget, concurrency: int, sessions: int) -> NodeBudget:
    return dataclasses.replace(
        base, max_active_sessions=concurrency, max_batch_size=concurrency,
        max_queue_depth=max(base.max_queue_depth, sessions),
    )


@dataclass(slots=True)
class Pass:
    """One run of one level: its deterministic records and its timing."""

    sessions: list[dict]
    ticks: list[dict]  # full tick records, timing included
    timing: list[dict]
    wall_s: float
    rejected: int
    cache_misses: int
    failed: int


def run_pass(
    requests: Sequence[GenerationRequest],
    budget: NodeBudget,
    engine: BatchEngine,
    clock: Callable[[], int] = time.monotonic_ns,
    on_tick: Callable[[TickRecord], None] | None = None,
) -> Pass:
    """Submit every request, run the scheduler to completion, keep the raw records."""
    sched = ContinuousBatchScheduler(engine, budget, clock)
    t0 = clock()
    rejected = sum(not sched.submit(r).accepted for r in requests)
    sched.run_to_completion(on_tick=on_tick)
    wall_s = (clock() - t0) / 1e9
    ended = sched.sessions()
    tel = sched.telemetry()
    return Pass([session_record(s) for s in ended], [t.to_dict() for t in sched.ticks()],
                [session_timing(s, t0) for s in ended], wall_s, rejected, tel.cache_misses, tel.failed)


def deterministic_ticks(ticks: Sequence[dict]) -> list[dict]:
    return [{k: v for k, v in t.items() if k not in figures.TIMING_TICK_FIELDS} for t in ticks]


def level_record(concurrency: int, budget: NodeBudget, passes: Sequence[tuple[int, int, Pass]]) -> dict:
    """The results.json record of a level: repetition 0's deterministic records, every repetition's raw
    timing and wall figures, and their summary. ``passes`` are (repetition, position in its order, pass)."""
    first = passes[0][2]
    ticks = deterministic_ticks(first.ticks)
    repetitions = [
        {"repetition": r, "position": position, "wall_s": p.wall_s, "tick_records": p.ticks, "sessions": p.timing,
         "wall": figures.wall_figures(p.timing, p.ticks, p.wall_s)}
        for r, position, p in passes
    ]
    return {
        "concurrency": concurrency,
        "budget": budget.to_dict(),
        **figures.summarize_ticks(ticks),
        "rejected_admissions": first.rejected,
        "cache_misses": first.cache_misses,
        "failed": first.failed,
        "sessions": first.sessions,
        "tick_records": ticks,
        "repetitions": repetitions,
        "wall": figures.repetition_summary([rep["wall"] for rep in repetitions]),
    }


def level_orders(levels: Sequence[int], repeat: int) -> list[list[int]]:
    """Repetition r runs every level, in the ascending order rotated by r: drift hits every level alike."""
    return [list(levels[r % len(levels):]) + list(levels[: r % len(levels)]) for r in range(repeat)]


def run_concurrency_sweep(
    levels: Sequence[int],
    workload: Workload,
    budget: NodeBudget,
    engine_factory: Callable[[NodeBudget], BatchEngine],
    clock: Callable[[], int] = time.monotonic_ns,
    on_tick: Callable[[int, TickRecord], None] | None = None,
    repeat: int = 1,
    warmup: int = 0,
) -> ConcurrencySweep:
    """``warmup`` unrecorded passes of every level, then ``repeat`` recorded ones, interleaved."""
    ordered = validate_levels(levels, workload.sessions)
    budgets = {c: level_budget(budget, c, workload.sessions) for c in ordered}

    def one_pass(c: int) -> Pass:
        engine = engine_factory(budgets[c])  # a fresh KV manager per pass
        per_level = (lambda rec, c=c: on_tick(c, rec)) if on_tick else None
        return run_pass(workload.requests(engine.vocab_size), budgets[c], engine, clock, per_level)

    for _ in range(warmup):
        for c in ordered:
            one_pass(c)
    passes: dict[int, list[tuple[int, int, Pass]]] = {c: [] for c in ordered}
    for r, order in enumerate(level_orders(ordered, repeat)):
        for position, c in enumerate(order):
            passes[c].append((r, position, one_pass(c)))
    records = [level_record(c, budgets[c], passes[c]) for c in ordered]
    divergence = figures.sweep_divergence(records)
    return ConcurrencySweep(
        levels=records,
        # A session that failed proves nothing about corruption: such a sweep is not corruption free.
        corruption_free=divergence is None and figures.unfinished_sessions(records) == 0,
        first_divergence=divergence,
        saturation_concurrency=figures.saturation_level([r["concurrency"] for r in records],
                                                        [r["avg_batch_occupancy"] for r in records]),
        reference_concurrency=records[0]["concurrency"],
    )
