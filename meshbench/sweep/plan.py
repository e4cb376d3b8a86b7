"""A sweep's plan: its levels (concurrency x arrival process x fault row), each level's budget, the order
repetitions run them in, and each level's arrival times, all fixed before the first pass runs."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Sequence

from meshbench.analysis.figures import NEAR_TIE
from meshbench.engine.base import EngineLimits
from meshbench.errors import MeshbenchError
from meshbench.records.context import Budget, Slo
from meshbench.scheduler.budget import engine_limits
from meshbench.workload import arrivals as arrivals_mod
from meshbench.workload.arrivals import Arrivals
from meshbench.workload.config import RunConfig
from meshbench.workload.faults import Fault
from meshbench.workload.workload import Workload


def level_budget(base: Budget, concurrency: int, sessions: int, all_at_once: bool = True) -> Budget:
    """At level c: c active sessions and a batch of c. With every session submitted at once the queue is
    raised to hold them all (the DGR-012 rule); with arrivals over time the configured queue is measured."""
    return dataclasses.replace(
        base,
        max_active_sessions=concurrency,
        max_batch_size=concurrency,
        max_queue_depth=max(base.max_queue_depth, sessions) if all_at_once else base.max_queue_depth,
    )


@dataclass(frozen=True, slots=True)
class Level:
    """One level of a sweep: a concurrency, the arrival process its sessions follow, the faults it suffers."""

    concurrency: int
    arrivals: Arrivals
    faults: tuple[Fault, ...] = ()

    @property
    def rate(self) -> float | None:
        return self.arrivals.rate


def plan_levels(
    levels: Sequence[int],
    workload: Workload,
    rates: Sequence[float] | None,
    fault_rows: Sequence[tuple[Fault, ...]] = (),
) -> list[Level]:
    """The levels in order: by rate (when rates are swept) or by fault row, then by concurrency."""
    ordered = sorted(levels)  # validated once, by the runner, before the engine loads (run.prepare)
    process = arrivals_mod.parse(workload.arrivals)
    if fault_rows:
        return [Level(c, process, row) for row in fault_rows for c in ordered]
    if rates is None:
        return [Level(c, process) for c in ordered]
    return [Level(c, process.with_rate(r)) for r in sorted(rates) for c in ordered]


def level_orders(count: int, repeat: int) -> list[list[int]]:
    """Repetition r runs every level, in the sweep's order rotated by r: drift hits every level alike."""
    return [list(range(r % count, count)) + list(range(r % count)) for r in range(repeat)]


@dataclass(frozen=True, slots=True)
class SweepPlan:
    """What a sweep runs: the levels, the jobs, the node's budget, and how (``SweepPlan.of`` a run config)."""

    levels: Sequence[int]
    workload: Workload
    budget: Budget
    repeat: int = 1  # recorded passes per level
    warmup: int = 0  # unrecorded passes per level first
    rates: Sequence[float] | None = None  # arrival rates crossed with the levels
    slo: Slo = Slo()
    wall: bool = False  # arrivals on the wall clock (rates per second): admission depends on speed
    fault_rows: Sequence[tuple[Fault, ...]] = ()  # each row of faults is run at every level
    restart: bool = False  # a lost engine is replaced and its sessions resubmitted
    prefill: str = "whole"
    prove_isolation: bool = True
    isolation_rounds: int = 4  # the separating family's rounds (meshbench.analysis.isolation), as RunConfig's
    isolation_family: str = "constant-weight"  # which separating family (isolation.FAMILIES), as RunConfig's
    prefix_block_tokens: int = 0  # the engine's prefix cache, blocks of this many positions (0: none)
    near_tie: float = NEAR_TIE  # the engine's: a margin below it is one its kernels' rounding may flip

    @classmethod
    def of(cls, cfg: RunConfig) -> "SweepPlan":
        return cls(
            list(cfg.levels),
            cfg.workload,
            cfg.budget,
            cfg.repeat,
            cfg.warmup,
            cfg.rates,
            cfg.slo,
            cfg.clock == "wall",
            cfg.faults,
            cfg.restart_engine,
            cfg.prefill,
            cfg.isolation,
            cfg.isolation_rounds,
            cfg.isolation_family,
            cfg.engine.block_tokens if cfg.engine.prefix_cache else 0,
        )

    def limits(self, budget: Budget) -> EngineLimits:
        """What a pass's engine is built for: the level's budget, and the run's prefix cache."""
        return dataclasses.replace(engine_limits(budget), prefix_block_tokens=self.prefix_block_tokens)


def arrival_times(plan: Sequence[Level], workload: Workload, wall: bool, repeat: int) -> list[list]:
    """Each level's arrival times as recorded: ticks, or ms on the wall clock; a tick sweep too large to record is
    refused here, before it runs."""
    if wall:
        return [[t * 1e3 for t in lv.arrivals.seconds(workload.sessions, workload.seed)] for lv in plan]
    times_of = [lv.arrivals.ticks(workload.sessions, workload.seed) for lv in plan]
    check_record_size(plan, times_of, workload, repeat)
    return times_of


# Tick records a sweep may write (each a few hundred bytes, idle ticks included): beyond this results.json
# would grow past what verify loads (results.MAX_BYTES), so such a sweep is refused before it runs.
MAX_RECORDED_TICKS = 250_000


def check_record_size(
    plan: Sequence[Level], times_of: Sequence[Sequence[int]], workload: Workload, repeat: int
) -> None:
    work = sum(p + n for p, n in zip(workload.prompt_tokens, workload.new_tokens))
    bound = sum((max(times, default=0) + work + 1) * (repeat + 1) for times in times_of)
    if bound > MAX_RECORDED_TICKS:
        last = max(max(times, default=0) for times in times_of)
        raise MeshbenchError(
            f"this sweep could record up to {bound} ticks (the last session arrives at tick {last}, "
            f"{len(plan)} levels, {repeat} repetition(s)), more than the {MAX_RECORDED_TICKS} a "
            "results.json can hold: raise the arrival rate, or sweep fewer levels or repetitions"
        )


def isolation_skipped(level: Level, wall: bool, wanted: bool) -> str | None:
    """Why a level's isolation cannot be proven by perturbation (None: it can)."""
    if not wanted:
        return "not run: isolation is off in the config"
    if wall:
        return "not run: on the wall clock the schedule depends on speed, so a perturbed pass cannot hold it fixed"
    if level.faults:
        return "not run: the level injects faults"
    return None
