"""The concurrency sweep: the same jobs at every level, a fresh engine per level.

At level c the node allows c active sessions and a batch of c; every job is submitted
before the first tick and the queue holds them all. Each level becomes the record that
results.json holds (raw per-tick and per-session records plus the figures computed from
them by ``meshbench.figures``). Deterministic figures come from the scheduler;
wall-clock figures are reported beside them and never compared byte for byte.
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


def session_record(s: Session, t0: int) -> dict:
    """A session as results.json holds it; times relative to the level's start."""
    return {
        "session_id": s.session_id, "prompt_tokens": s.prompt_len, "max_new_tokens": s.request.max_new_tokens,
        "tokens": list(s.tokens), "margins": [_finite(m) for m in s.margins],
        "digest": figures.token_digest(s.tokens),
        "done_reason": s.done_reason.value if s.done_reason else "UNFINISHED", "error": s.error,
        "submit_ns": s.submit_ns - t0, "token_ns": [t - t0 for t in s.token_ns],
    }


def level_budget(base: NodeBudget, concurrency: int, sessions: int) -> NodeBudget:
    return dataclasses.replace(
        base, max_active_sessions=concurrency, max_batch_size=concurrency,
        max_queue_depth=max(base.max_queue_depth, sessions),
    )


def run_level(
    concurrency: int,
    requests: Sequence[GenerationRequest],
    budget: NodeBudget,
    engine: BatchEngine,
    clock: Callable[[], int] = time.monotonic_ns,
    on_tick: Callable[[TickRecord], None] | None = None,
) -> dict:
    """Run one level to completion; returns its results.json record."""
    sched = ContinuousBatchScheduler(engine, budget, clock)
    t0 = clock()
    rejected = sum(not sched.submit(r).accepted for r in requests)
    sched.run_to_completion(on_tick=on_tick)
    wall_s = (clock() - t0) / 1e9
    ticks = [t.to_dict() for t in sched.ticks()]
    sessions = [session_record(s, t0) for s in sched.sessions()]
    tel = sched.telemetry()
    return {
        "concurrency": concurrency,
        "budget": budget.to_dict(),
        **figures.summarize_ticks(ticks),
        "rejected_admissions": rejected,
        "cache_misses": tel.cache_misses,
        "failed": tel.failed,
        "sessions": sessions,
        "tick_records": ticks,
        "wall": figures.wall_figures(sessions, ticks, wall_s),
    }


def run_concurrency_sweep(
    levels: Sequence[int],
    workload: Workload,
    budget: NodeBudget,
    engine_factory: Callable[[NodeBudget], BatchEngine],
    clock: Callable[[], int] = time.monotonic_ns,
    on_tick: Callable[[int, TickRecord], None] | None = None,
) -> ConcurrencySweep:
    ordered = validate_levels(levels, workload.sessions)
    records: list[dict] = []
    for c in ordered:
        b = level_budget(budget, c, workload.sessions)
        engine = engine_factory(b)  # a fresh KV manager per level
        requests = workload.requests(engine.vocab_size)
        per_level = (lambda rec, c=c: on_tick(c, rec)) if on_tick else None
        records.append(run_level(c, requests, b, engine, clock, per_level))
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
