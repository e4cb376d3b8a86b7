"""The concurrency sweep: the same jobs at every level, a fresh engine per pass.

At level c the node allows c active sessions and a batch of c; every job is submitted
before the first tick and the queue holds them all. A sweep runs ``warmup`` unrecorded
passes of every level, then ``repeat`` recorded ones, repetition by repetition with the
level order rotated each time, then each level's isolation passes. Its steps, in order:
the plan (``sweep.plan``), the passes (``sweep.passes``), the isolation passes
(``sweep.prove``), the level records and verdicts (``sweep.level_record``).
"""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import Callable, Sequence

from meshbench.analysis import isolation, prefix
from meshbench.analysis.verdicts import ConcurrencySweep
from meshbench.engine.base import BatchEngine, EngineLimits
from meshbench.engine.setup import EngineSetup, close_engine
from meshbench.records.context import Budget
from meshbench.records.model import Reference
from meshbench.records.sharing import OwnKvReplay
from meshbench.records.tick import Tick
from meshbench.scheduler.budget import engine_limits
from meshbench.scheduler.session import GenerationRequest
from meshbench.sweep import own_kv
from meshbench.sweep.inject import FaultPlan
from meshbench.sweep.level_record import concurrency_sweep, level_record
from meshbench.sweep.passes import Pass, run_pass, run_pass_wall
from meshbench.sweep.plan import (
    Level,
    SweepPlan,
    arrival_times,
    isolation_skipped,
    level_budget,
    level_orders,
    plan_levels,
)
from meshbench.sweep.prove import isolation_record
from meshbench.workload.workload import Workload


@dataclasses.dataclass(frozen=True)
class PassDone:
    """A pass has ended: its level, what it was for, and how many passes the level is now planned to run in all
    (isolation's single-suspect confirmations are planned only once a session changed)."""

    level: int
    kind: str  # "warmup", "timed", "isolation" or "cache-off"
    done: int  # the level's passes ended so far, this one included
    planned: int  # never less than done


def run_concurrency_sweep(
    sweep: SweepPlan,
    engine_factory: Callable[[EngineLimits], BatchEngine],
    node: EngineSetup | None = None,
    clock: Callable[[], int] = time.monotonic_ns,
    sleep: Callable[[float], None] = time.sleep,
    on_tick: Callable[[int, Tick], None] | None = None,
    on_pass: Callable[[PassDone], None] | None = None,
) -> ConcurrencySweep:
    """``warmup`` unrecorded passes of every level, then ``repeat`` recorded ones, interleaved; then each level's
    isolation passes. Faults act on ``node``'s processes, and a lost engine is replaced by ``node.restart``."""
    workload, wall = sweep.workload, sweep.wall
    plan = plan_levels(sweep.levels, workload, sweep.rates, sweep.fault_rows)
    slo = sweep.slo
    budgets = [level_budget(sweep.budget, lv.concurrency, workload.sessions, lv.arrivals.all_at_once) for lv in plan]
    times_of = arrival_times(plan, workload, wall, sweep.repeat)
    eog = node.eog if node is not None else frozenset()
    count = _PassCount(sweep, plan, on_pass)

    def one_pass(
        i: int, requests: Sequence[GenerationRequest] | None = None, cache: bool = True, kind: str = "timed"
    ) -> Pass:
        limits = sweep.limits(budgets[i]) if cache else engine_limits(budgets[i])
        engine = engine_factory(limits)  # a fresh KV manager per pass
        c = plan[i].concurrency
        per_level = (lambda rec, c=c: on_tick(c, rec)) if on_tick else None
        requests = requests or workload.requests(engine.vocab_size, eog)
        try:
            if wall:
                return run_pass_wall(
                    requests, [t / 1e3 for t in times_of[i]], budgets[i], engine, clock, per_level, sleep, sweep.prefill
                )
            faults = FaultPlan(plan[i].faults, node.kill_engine if node else None, node.kill_worker if node else None)
            recover = _restarter(node, sweep.limits(budgets[i])) if sweep.restart else None
            return run_pass(requests, times_of[i], budgets[i], engine, clock, per_level, faults, recover, sweep.prefill)
        finally:
            close_engine(engine)
            count.ended(i, kind)

    for _ in range(sweep.warmup):
        for i in range(len(plan)):
            one_pass(i, kind="warmup")
    passes: list[list[tuple[int, int, Pass]]] = [[] for _ in plan]
    for r, order in enumerate(level_orders(len(plan), sweep.repeat)):
        for position, i in enumerate(order):
            passes[i].append((r, position, one_pass(i)))
    vocab = node.vocab_size if node is not None else _vocab(engine_factory, budgets[0])
    records = []
    for i, lv in enumerate(plan):
        first = passes[i][0][2]
        proof = isolation_record(
            first,
            functools.partial(one_pass, i, kind="isolation"),
            workload.requests(vocab, eog),
            vocab,
            workload.seed,
            isolation_skipped(lv, wall, sweep.prove_isolation),
            sweep.isolation_rounds,
            isolation.prefix_groups(workload.groups()),
            workload.prefix_tokens,
            sweep.isolation_family,
        )
        # with a prefix cache, the level once more with it off: cache equivalence (on the wall clock or under
        # faults the schedule is not the level's own, and sessions are compared only where both completed)
        cache_off = one_pass(i, cache=False, kind="cache-off") if sweep.prefix_block_tokens else None
        own = None if cache_off is None else _own_kv(passes[i][0][2], cache_off, engine_factory, budgets[i], workload)
        shared = (cache_off, sweep.near_tie, sweep.prefix_block_tokens, own)
        records.append(level_record(lv, budgets[i], times_of[i], slo, passes[i], proof, wall, *shared))
    return concurrency_sweep(records, _reference(sweep, plan, engine_factory, clock, eog), sweep.isolation_family)


def _reference(
    sweep: SweepPlan, plan: Sequence[Level], factory: Callable[[EngineLimits], BatchEngine], clock, eog
) -> Reference | None:
    """Each session alone, where arrivals over time or faults keep a level's schedule from being the reference."""
    if all(lv.arrivals.all_at_once for lv in plan) and not sweep.fault_rows:
        return None
    wl = sweep.workload
    return alone_reference(wl, sweep.budget, factory, clock, sweep.prefill, eog, sweep.prefix_block_tokens)


class _PassCount:
    """Each level's passes ended and planned, told to ``on_pass`` as each ends (a confirmation not planned grows the
    total as it ends, so the count never passes it)."""

    def __init__(self, sweep: SweepPlan, plan: Sequence[Level], on_pass: Callable[[PassDone], None] | None):
        self.levels = [lv.concurrency for lv in plan]
        self.planned = [_planned_passes(sweep, lv) for lv in plan]
        self.done = [0 for _ in plan]
        self.on_pass = on_pass

    def ended(self, i: int, kind: str) -> None:
        self.done[i] += 1
        self.planned[i] = max(self.planned[i], self.done[i])
        if self.on_pass is not None:
            self.on_pass(PassDone(self.levels[i], kind, self.done[i], self.planned[i]))


def _planned_passes(sweep: SweepPlan, lv: Level) -> int:
    """The passes a level runs, as far as they are known before it starts: warm-ups, timed passes, the isolation
    family and the cache-off pass (confirmations are added as they run)."""
    wl = sweep.workload
    family = 0
    if isolation_skipped(lv, sweep.wall, sweep.prove_isolation) is None:
        groups = isolation.prefix_groups(wl.groups())
        family = len(isolation.family_sets(wl.session_ids(), sweep.isolation_rounds, groups, sweep.isolation_family))
    return sweep.warmup + sweep.repeat + family + (1 if sweep.prefix_block_tokens else 0)


def _own_kv(
    first: Pass, cache_off: Pass, factory: Callable[[EngineLimits], BatchEngine], budget: Budget, wl: Workload
) -> OwnKvReplay | None:
    """Where a conversation's turns differ with the cache on and off: the level replayed on each session's own KV
    (meshbench.sweep.own_kv), on an engine that can (llama.cpp's, one stream per sequence: kv_unified off; a
    sequence for every session). None where nothing differs, or no such replay runs."""
    if prefix.cache_verdict(first.sessions, cache_off.sessions, None, 0.0).holds:
        return None
    if not prefix.replayable(first.sessions, first.ticks):
        return None
    engine = factory(dataclasses.replace(engine_limits(budget), max_active_sessions=wl.sessions))
    try:
        if not hasattr(engine, "resume") or getattr(engine, "kv_unified", True):
            return None
        requests = wl.requests(engine.vocab_size)  # (conversations run without eos stop)
        return own_kv.own_kv(engine, first.sessions, first.ticks, requests)
    except Exception:  # noqa: BLE001 (a replay the engine could not run finds nothing: the margin rule stands alone)
        return None
    finally:
        close_engine(engine)


def _restarter(node: EngineSetup | None, limits: EngineLimits) -> Callable[[], BatchEngine] | None:
    """A fresh engine after a loss, where the node's engine runs in a process that can be restarted."""
    restart = node.restart if node is not None else None
    if restart is None:
        return None
    return lambda: restart(limits)


def _vocab(engine_factory: Callable[[EngineLimits], BatchEngine], budget: Budget) -> int:
    """A bare engine factory's vocabulary (one engine, made and closed)."""
    probe = engine_factory(engine_limits(budget))
    try:
        return probe.vocab_size
    finally:
        close_engine(probe)


def alone_reference(
    workload: Workload,
    budget: Budget,
    engine_factory: Callable[[EngineLimits], BatchEngine],
    clock: Callable[[], int],
    prefill: str = "whole",
    eog: frozenset[int] = frozenset(),
    prefix_block_tokens: int = 0,
) -> Reference:
    """Each session run alone: the reference every completed session of an arrival sweep must equal."""
    alone = level_budget(budget, 1, workload.sessions)
    engine = engine_factory(dataclasses.replace(engine_limits(alone), prefix_block_tokens=prefix_block_tokens))
    try:
        first = run_pass(
            workload.requests(engine.vocab_size, eog), [0] * workload.sessions, alone, engine, clock, prefill=prefill
        )
    finally:
        close_engine(engine)
    return Reference(concurrency=1, sessions=first.sessions)
