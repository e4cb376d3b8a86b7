"""What running the engine in its own process costs: the same passes in the node's process and behind
the proxy, interleaved, on one config's workload.

Per pass it reports decode tokens/s (decode tokens over the summed decode-call time the scheduler
sees: behind the proxy that includes the round trip) and, for the isolated engine, the proxy's own
time per tick (round trip minus the child's time in the engine call) as a share of tick time.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable

from meshbench.analysis import figures, stats
from meshbench.engine.setup import EngineSetup, close_engine
from meshbench.records.model import Summary
from meshbench.scheduler.budget import engine_limits
from meshbench.sweep.passes import run_pass
from meshbench.sweep.plan import level_budget
from meshbench.sweep.run import prepare
from meshbench.workload.config import RunConfig

MODES = ("in-process", "isolated")


@dataclass(frozen=True, slots=True, kw_only=True)
class _Pass:
    decode_tokens_per_s: float
    tokens_per_s: float
    proxy_share: float
    proxy_us_per_tick: float
    tick_ms: float


@dataclass(frozen=True, slots=True, kw_only=True)
class IsolationLevel:
    """One level over the rounds (the proxy's figures: the isolated engine's passes)."""

    concurrency: int
    in_process_decode_tokens_per_s: Summary
    isolated_decode_tokens_per_s: Summary
    isolated_over_in_process: Summary  # paired by round
    proxy_share_of_tick: Summary
    proxy_us_per_tick: Summary
    tick_ms: Summary


@dataclass(frozen=True, slots=True)
class IsolationBench:
    """``meshbench bench isolation``'s figures (``--json``: this record's fields)."""

    config: str
    rounds: int
    levels: list[IsolationLevel]


def _one_pass(setup: EngineSetup, cfg: RunConfig, c: int) -> _Pass:
    budget = level_budget(cfg.budget, c, cfg.workload.sessions)
    engine = setup.make(engine_limits(budget))
    process = getattr(engine, "process", None)
    before = (process.round_trip_ns, process.engine_ns) if process else (0, 0)
    try:
        p = run_pass(
            cfg.workload.requests(setup.vocab_size), [0] * cfg.workload.sessions, budget, engine, prefill=cfg.prefill
        )
    finally:
        close_engine(engine)
    tick_ns = sum(t.tick_ns or 0 for t in p.ticks)
    proxy_ns = ((process.round_trip_ns - before[0]) - (process.engine_ns - before[1])) if process else 0
    wall = figures.wall_figures(p.timing, p.ticks, p.wall_s)
    return _Pass(
        decode_tokens_per_s=wall.decode_tokens_per_s,
        tokens_per_s=wall.tokens_per_s,
        proxy_share=proxy_ns / tick_ns if tick_ns else 0.0,
        proxy_us_per_tick=proxy_ns / 1e3 / len(p.ticks),
        tick_ms=tick_ns / 1e6 / len(p.ticks),
    )


def run(
    cfg: RunConfig, levels: list[int], rounds: int, progress: Callable[[str], None] = lambda m: None
) -> IsolationBench:
    """``rounds`` rounds; in each, every level in both modes, the mode order alternating by round."""
    setups = {
        m: prepare(dataclasses.replace(cfg, engine=dataclasses.replace(cfg.engine, isolate=m == "isolated")))
        for m in MODES
    }
    try:
        for m in MODES:  # one unrecorded pass each: the first pass of a process is measurably slower
            _one_pass(setups[m], cfg, levels[0])
        runs: dict[tuple[str, int], list[_Pass]] = {(m, c): [] for m in MODES for c in levels}
        for r in range(rounds):
            for m in MODES if r % 2 == 0 else MODES[::-1]:
                for c in levels:
                    progress(f"round {r + 1}/{rounds}: {m}, concurrency {c}")
                    runs[(m, c)].append(_one_pass(setups[m], cfg, c))
    finally:
        for s in setups.values():
            s.close()
    return IsolationBench(config=cfg.source, rounds=rounds, levels=[_level(c, runs) for c in levels])


def _level(c: int, runs: dict[tuple[str, int], list[_Pass]]) -> IsolationLevel:
    local, iso = runs[("in-process", c)], runs[("isolated", c)]
    return IsolationLevel(
        concurrency=c,
        in_process_decode_tokens_per_s=stats.summary([x.decode_tokens_per_s for x in local]),
        isolated_decode_tokens_per_s=stats.summary([x.decode_tokens_per_s for x in iso]),
        isolated_over_in_process=stats.summary(
            [b.decode_tokens_per_s / a.decode_tokens_per_s for a, b in zip(local, iso)]
        ),
        proxy_share_of_tick=stats.summary([x.proxy_share for x in iso]),
        proxy_us_per_tick=stats.summary([x.proxy_us_per_tick for x in iso]),
        tick_ms=stats.summary([x.tick_ms for x in iso]),
    )
