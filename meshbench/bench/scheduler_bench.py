"""`meshbench bench scheduler`: what one tick of the scheduler itself costs as live sessions grow.

The engine does nothing (every call returns at once), so a tick's time is the
scheduler's own: choosing the decode batch, prefilling, releasing, promoting and
recording. ``batch`` sessions run (each prefilled with a 4-token prompt, none ever
finishes); the other live sessions wait in the queue. Figures are medians over
``rounds`` interleaved rounds of ``ticks`` ticks each, so drift hits every size alike.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from meshbench.engine.base import DecodeItem, PrefillChunk, StepResult, TickResult
from meshbench.records.context import Budget
from meshbench.scheduler.session import GenerationRequest
from meshbench.sweep.driver import NodeDriver

PROMPT = (1, 2, 3, 4)
NEVER_ENDS = 1 << 30  # new tokens: no session finishes while it is timed


class NullEngine:
    """A BatchEngine that computes nothing: token 0 for every step, no KV."""

    recipe_fingerprint = "0" * 64
    vocab_size = 1
    kv_bytes_per_token = 1
    weight_bytes = 1
    scratch_bytes_per_session = 1
    kv_bytes_in_use = 0
    kv_bytes_shared = None  # no prefix cache

    def step(self, decode: Sequence[DecodeItem], prefill: Sequence[PrefillChunk]) -> TickResult:
        return TickResult(
            [StepResult(it.session_id, 0, 1.0) for it in decode],
            [StepResult(c.session.session_id, 0 if c.last else None, 1.0) for c in prefill],
        )

    def release(self, session_id: str) -> None:
        pass

    def close(self) -> None:
        pass


def _scheduler(live: int, batch: int) -> NodeDriver:
    budget = Budget(
        weight_bytes=1,
        kv_bytes=1 << 50,
        scratch_bytes=1 << 50,
        max_active_sessions=batch,
        max_queue_depth=live,
        max_batch_size=batch,
        max_prefill_tokens_per_tick=len(PROMPT) * batch,
    )
    sched = NodeDriver(NullEngine(), budget)
    for i in range(live):
        assert sched.submit(GenerationRequest(f"s{i}", PROMPT, NEVER_ENDS)).accepted
    sched.run_tick()  # prefills the first ``batch`` sessions: from here on every tick is the same
    return sched


def tick_ms(sched: NodeDriver, ticks: int) -> list[float]:
    out = []
    for _ in range(ticks):
        t0 = time.perf_counter_ns()
        sched.run_tick()
        out.append((time.perf_counter_ns() - t0) / 1e6)
    return out


def run(
    live_counts: list[int],
    batch: int = 64,
    ticks: int = 50,
    rounds: int = 5,
    progress: Callable[[str], None] = lambda msg: None,
) -> SchedulerBench:
    scheds = {}
    for n in live_counts:
        progress(f"submitting {n} sessions")
        scheds[n] = _scheduler(n, batch)
    samples: dict[int, list[float]] = {n: [] for n in live_counts}
    for r in range(rounds):
        progress(f"round {r + 1} of {rounds}")
        order = live_counts[r % len(live_counts) :] + live_counts[: r % len(live_counts)]  # rotate each round
        for n in order:
            samples[n] += tick_ms(scheds[n], ticks)
    base = float(np.median(samples[live_counts[0]]))
    rows = []
    for n in live_counts:
        med = float(np.median(samples[n]))
        rows.append(
            LiveSize(
                live=n,
                ms_per_tick_median=med,
                ms_per_tick_p10=float(np.percentile(samples[n], 10)),
                ms_per_tick_p90=float(np.percentile(samples[n], 90)),
                vs_first=med / base,
                samples=len(samples[n]),
            )
        )
    return SchedulerBench(batch=batch, prompt_tokens=len(PROMPT), ticks_per_round=ticks, rounds=rounds, sizes=rows)


@dataclass(frozen=True, slots=True)
class LiveSize:
    """One number of live sessions: a tick's time, median and spread over every timed tick (ms)."""

    live: int
    ms_per_tick_median: float
    ms_per_tick_p10: float
    ms_per_tick_p90: float
    vs_first: float  # the median over the first size's
    samples: int


@dataclass(frozen=True, slots=True)
class SchedulerBench:
    """``meshbench bench scheduler``'s figures (``--json``: this record's fields)."""

    batch: int
    prompt_tokens: int
    ticks_per_round: int
    rounds: int
    sizes: list[LiveSize]
