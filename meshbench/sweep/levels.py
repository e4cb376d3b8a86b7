"""The concurrency sweep: the same jobs at every level, a fresh engine per pass.

At level c the node allows c active sessions and a batch of c; every job is submitted
before the first tick and the queue holds them all. A sweep runs ``warmup`` unrecorded
passes of every level, then ``repeat`` recorded ones, repetition by repetition with the
level order rotated each time. Each level becomes the record results.json holds: the
deterministic records of its first repetition (which every other repetition must equal)
and every repetition's raw timing, with the figures ``meshbench.analysis.figures`` computes from them.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass
from typing import Callable, Sequence

from meshbench.analysis import backpressure, figures, isolation, verdicts
from meshbench.analysis.verdicts import ConcurrencySweep
from meshbench.engine.base import BatchEngine, EngineLimits
from meshbench.engine.setup import EngineSetup, close_engine
from meshbench.errors import MeshbenchError
from meshbench.records import LevelRecord, SessionRecord, SessionTiming, SubmitEvent, TickDict
from meshbench.scheduler.budget import ACCEPTED, AdmissionDecision, NodeBudget
from meshbench.scheduler.session import GenerationRequest, Session
from meshbench.scheduler.telemetry import TickRecord
from meshbench.sweep.driver import NodeDriver, WallClock
from meshbench.sweep.inject import FaultPlan
from meshbench.workload import arrivals as arrivals_mod
from meshbench.workload.arrivals import Arrivals
from meshbench.workload.config import RunConfig, Workload, validate_levels
from meshbench.workload.faults import Fault

# The scheduler's own counters, per pass: verify checks each against the raw records.
COUNTERS = ("completed", "cancelled", "failed", "cache_misses", "rejected_admissions", "engine_losses", "resubmitted")


def _finite(x):
    """JSON has no inf/nan: a margin that is not finite is recorded as null."""
    return x if isinstance(x, (int, float)) and math.isfinite(x) else None


def session_record(s: Session) -> SessionRecord:
    """A session's deterministic record, as results.json holds it."""
    return {
        "session_id": s.session_id,
        "epoch": s.epoch,
        "end_tick": s.end_tick,
        "prompt_tokens": s.prompt_len,
        "max_new_tokens": s.request.max_new_tokens,
        "tokens": list(s.tokens),
        "margins": [_finite(m) for m in s.margins],
        "digest": figures.token_digest(s.tokens),
        "done_reason": s.done_reason.value if s.done_reason else "UNFINISHED",
        "error": s.error,
    }


def session_timing(s: Session, t0: int) -> SessionTiming:
    """A session's stamps in one repetition, relative to the start of that pass."""
    return {
        "session_id": s.session_id,
        "epoch": s.epoch,
        "digest": figures.token_digest(s.tokens),
        "done_reason": s.done_reason.value if s.done_reason else "UNFINISHED",
        "submit_ns": s.submit_ns - t0,
        "admit_ns": None if s.admit_ns is None else s.admit_ns - t0,
        "token_ns": [t - t0 for t in s.token_ns],
    }


def level_budget(base: NodeBudget, concurrency: int, sessions: int, all_at_once: bool = True) -> NodeBudget:
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


@dataclass(slots=True)
class Pass:
    """One run of one level: its deterministic records and its timing."""

    sessions: list[SessionRecord]
    ticks: list[TickDict]  # full tick records, timing included
    timing: list[SessionTiming]
    events: list[SubmitEvent]  # one per arrival: tick, session, decision, active and queued at that moment
    wall_s: float
    cache_misses: int
    failed: int
    counts: dict  # the scheduler's COUNTERS
    fault_events: list[dict]  # one per injected fault (meshbench.sweep.inject)
    engine_losses: list[dict]  # one per engine loss: tick, cause, lost, resubmitted


def run_pass(
    requests: Sequence[GenerationRequest],
    arrival_ticks: Sequence[int],
    budget: NodeBudget,
    engine: BatchEngine,
    clock: Callable[[], int] = time.monotonic_ns,
    on_tick: Callable[[TickRecord], None] | None = None,
    plan: FaultPlan | None = None,
    recover: Callable[[], BatchEngine] | None = None,
    prefill: str = "whole",
) -> Pass:
    """Submit each request before its arrival tick, run the node to completion, keep the raw records.

    ``plan``: the faults this pass suffers; ``recover``: the restart policy after an engine loss."""
    plan = plan or FaultPlan(())
    wrapped = plan.wrap(engine)
    node = NodeDriver(
        wrapped, budget, clock, prefill_policy=prefill, recover=(lambda: plan.wrap(recover())) if recover else None
    )
    plan.node = node
    events: list[dict] = []
    t0 = clock()
    try:
        node.run_to_completion(
            on_tick=on_tick,
            arrivals=list(zip(arrival_ticks, requests)),
            on_submit=lambda tick, d, _at, _now: events.append(submit_event(tick, d)),
            before_tick=plan.before_tick,
        )
    finally:
        if node.engine is not wrapped:  # a restarted engine is this pass's to free
            close_engine(node.engine)
    return finished_pass(node, events, t0, clock(), plan.events(budget.max_active_sessions, len(node.ticks())))


def submit_event(tick: int, d: AdmissionDecision, **extra) -> SubmitEvent:
    """One arrival's record: the tick before which it was submitted, the decision and the node's state."""
    return {
        "tick": tick,
        "session_id": d.session_id,
        "epoch": d.epoch,
        "decision": d.reason.value,
        "active": d.active_sessions,
        "queued": d.queue_depth,
        **extra,
    }


def finished_pass(
    node: NodeDriver, events: list[dict], t0: int, t1: int, fault_events: list[dict] | None = None
) -> Pass:
    """The raw records of a pass that started at ``t0`` and ended at ``t1`` (clock nanoseconds)."""
    ended = node.sessions()
    tel = node.telemetry().to_dict()
    return Pass(
        [session_record(s) for s in ended],
        [t.to_dict() for t in node.ticks()],
        [session_timing(s, t0) for s in ended],
        events,
        (t1 - t0) / 1e9,
        tel["cache_misses"],
        tel["failed"],
        {k: tel[k] for k in COUNTERS},
        fault_events or [],
        node.losses(),
    )


def run_pass_wall(
    requests: Sequence[GenerationRequest],
    arrival_s: Sequence[float],
    budget: NodeBudget,
    engine: BatchEngine,
    clock: Callable[[], int] = time.monotonic_ns,
    on_tick: Callable[[TickRecord], None] | None = None,
    sleep: Callable[[float], None] = time.sleep,
    prefill: str = "whole",
) -> Pass:
    """The wall clock: a session is submitted once its arrival time has passed (checked before each tick);
    when nothing is live the node sleeps until the next arrival. Ticks run only with live sessions, so
    admission depends on speed: such a pass is reported, not compared by --rerun."""
    node = NodeDriver(engine, budget, clock, prefill_policy=prefill)
    events: list[dict] = []
    t0 = clock()

    def submitted(tick: int, d: AdmissionDecision, arrival: float, now: float) -> None:
        events.append(submit_event(tick, d, arrival_ms=arrival * 1e3, submit_ms=now * 1e3))

    node.run_to_completion(
        on_tick=on_tick, arrivals=list(zip(arrival_s, requests)), on_submit=submitted, wall=WallClock(t0, sleep)
    )
    return finished_pass(node, events, t0, clock())


def level_record(
    level: Level,
    budget: NodeBudget,
    arrival_times: list,
    slo: dict,
    passes: Sequence[tuple[int, int, Pass]],
    wall: bool = False,
) -> LevelRecord:
    """The results.json record of a level: repetition 0's deterministic records, every repetition's raw
    timing and wall figures, and their summary. ``passes`` are (repetition, position in its order, pass)."""
    first = passes[0][2]
    ticks = figures.deterministic_ticks(first.ticks)
    repetitions = [
        {
            "repetition": r,
            "position": position,
            "wall_s": p.wall_s,
            "tick_records": p.ticks,
            "sessions": p.timing,
            "wall": figures.wall_figures(p.timing, p.ticks, p.wall_s),
        }
        for r, position, p in passes
    ]
    record: LevelRecord = {
        "concurrency": level.concurrency,
        "arrivals": level.arrivals.label(),
        "rate": level.rate,
        "budget": budget.to_dict(),
        **figures.summarize_ticks(ticks),
        "rejected_admissions": sum(e["decision"] not in ACCEPTED for e in first.events),
        "cache_misses": first.cache_misses,
        "failed": first.failed,
        "counts": first.counts,
        "faults": [f.label for f in level.faults],
        "fault_events": first.fault_events,
        "engine_losses": first.engine_losses,
        "arrival_times": arrival_times,  # ticks, or ms on the wall clock
        "submit_events": first.events,
        "sessions": first.sessions,
        "tick_records": ticks,
    }
    # On the wall clock the SLO is in ms: goodput is per second, from the first repetition's stamps.
    record["backpressure"] = backpressure.level_figures(record, {} if wall else slo)
    if wall:
        record["backpressure"].update(backpressure.wall_figures(record, first.timing, first.wall_s, slo))
    record["repetitions"] = repetitions
    record["wall"] = figures.repetition_summary([rep["wall"] for rep in repetitions])
    return record


def sweep_levels(
    levels: Sequence[int],
    workload: Workload,
    rates: Sequence[float] | None,
    fault_rows: Sequence[tuple[Fault, ...]] = (),
) -> list[Level]:
    """The levels in order: by rate (when rates are swept) or by fault row, then by concurrency."""
    ordered = validate_levels(levels, workload.sessions)
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
    budget: NodeBudget
    repeat: int = 1  # recorded passes per level
    warmup: int = 0  # unrecorded passes per level first
    rates: Sequence[float] | None = None  # arrival rates crossed with the levels
    slo: dict | None = None
    wall: bool = False  # arrivals on the wall clock (rates per second): admission depends on speed
    fault_rows: Sequence[tuple[Fault, ...]] = ()  # each row of faults is run at every level
    restart: bool = False  # a lost engine is replaced and its sessions resubmitted
    prefill: str = "whole"
    prove_isolation: bool = True
    isolation_rounds: int = 4  # the separating family's rounds (meshbench.analysis.isolation), as RunConfig's

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
        )


def run_concurrency_sweep(
    sweep: SweepPlan,
    engine_factory: Callable[[EngineLimits], BatchEngine],
    node: EngineSetup | None = None,
    clock: Callable[[], int] = time.monotonic_ns,
    sleep: Callable[[float], None] = time.sleep,
    on_tick: Callable[[int, TickRecord], None] | None = None,
) -> ConcurrencySweep:
    """``warmup`` unrecorded passes of every level, then ``repeat`` recorded ones, interleaved; then each level's
    isolation passes. Faults act on ``node``'s processes, and a lost engine is replaced by ``node.restart``."""
    workload, wall = sweep.workload, sweep.wall
    plan = sweep_levels(sweep.levels, workload, sweep.rates, sweep.fault_rows)
    slo = sweep.slo or {"ttft": None, "tpot": None}
    budgets = [level_budget(sweep.budget, lv.concurrency, workload.sessions, lv.arrivals.all_at_once) for lv in plan]
    times_of = arrival_times(plan, workload, wall, sweep.repeat)
    eog = node.eog if node is not None else frozenset()

    def one_pass(i: int, requests: Sequence[GenerationRequest] | None = None) -> Pass:
        engine = engine_factory(budgets[i].engine_limits())  # a fresh KV manager per pass
        c = plan[i].concurrency
        per_level = (lambda rec, c=c: on_tick(c, rec)) if on_tick else None
        requests = requests or workload.requests(engine.vocab_size, eog)
        try:
            if wall:
                return run_pass_wall(
                    requests, [t / 1e3 for t in times_of[i]], budgets[i], engine, clock, per_level, sleep, sweep.prefill
                )
            faults = FaultPlan(plan[i].faults, node and node.kill_engine, node and node.kill_worker)
            recover = _restarter(node, budgets[i]) if sweep.restart else None
            return run_pass(requests, times_of[i], budgets[i], engine, clock, per_level, faults, recover, sweep.prefill)
        finally:
            close_engine(engine)

    for _ in range(sweep.warmup):
        for i in range(len(plan)):
            one_pass(i)
    passes: list[list[tuple[int, int, Pass]]] = [[] for _ in plan]
    for r, order in enumerate(level_orders(len(plan), sweep.repeat)):
        for position, i in enumerate(order):
            passes[i].append((r, position, one_pass(i)))
    records = [level_record(lv, budgets[i], times_of[i], slo, passes[i], wall) for i, lv in enumerate(plan)]
    vocab = node.vocab_size if node is not None else _vocab(engine_factory, budgets[0])
    for i, lv in enumerate(plan):
        prove_level(
            records[i],
            lv,
            lambda reqs, i=i: one_pass(i, reqs),
            workload.requests(vocab, eog),
            passes[i][0][2],
            vocab,
            workload.seed,
            isolation_skipped(lv, wall, sweep.prove_isolation),
            sweep.isolation_rounds,
        )
    reference = None
    if not all(lv.arrivals.all_at_once for lv in plan) or sweep.fault_rows:
        reference = alone_reference(workload, sweep.budget, engine_factory, clock, sweep.prefill, eog)
    return sweep_verdicts(records, reference)


def _restarter(node: EngineSetup | None, budget: NodeBudget) -> Callable[[], BatchEngine] | None:
    """A fresh engine after a loss, where the node's engine runs in a process that can be restarted."""
    if node is None or node.restart is None:
        return None
    return lambda: node.restart(budget.engine_limits())


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


def prove_level(
    record: dict,
    level: Level,
    run: Callable[[Sequence[GenerationRequest]], Pass],
    requests: Sequence[GenerationRequest],
    baseline: Pass,
    vocab: int,
    seed: int,
    skipped: str | None,
    rounds: int = 1,
):
    """The level's isolation records (its perturbation passes, or why there are none) and their verdict."""
    record["isolation"] = (
        {"sessions": None, "passes": None, "reason": skipped}
        if skipped is not None
        else isolation.run_level(run, requests, baseline, vocab, seed, rounds)
    )
    record["isolation_verdict"] = isolation.verdict(record)


def _vocab(engine_factory: Callable[[EngineLimits], BatchEngine], budget: NodeBudget) -> int:
    """A bare engine factory's vocabulary (one engine, made and closed)."""
    probe = engine_factory(budget.engine_limits())
    try:
        return probe.vocab_size
    finally:
        close_engine(probe)


def isolation_skipped(level: Level, wall: bool, wanted: bool) -> str | None:
    """Why a level's isolation cannot be proven by perturbation (None: it can)."""
    if not wanted:
        return "not run: isolation is off in the config"
    if wall:
        return "not run: on the wall clock the schedule depends on speed, so a perturbed pass cannot hold it fixed"
    if level.faults:
        return "not run: the level injects faults"
    return None


def alone_reference(
    workload: Workload,
    budget: NodeBudget,
    engine_factory: Callable[[EngineLimits], BatchEngine],
    clock: Callable[[], int],
    prefill: str = "whole",
    eog: frozenset[int] = frozenset(),
) -> dict:
    """Each session run alone: the reference every completed session of an arrival sweep must equal."""
    alone = level_budget(budget, 1, workload.sessions)
    engine = engine_factory(alone.engine_limits())
    try:
        first = run_pass(
            workload.requests(engine.vocab_size, eog), [0] * workload.sessions, alone, engine, clock, prefill=prefill
        )
    finally:
        close_engine(engine)
    return {"concurrency": 1, "sessions": first.sessions}


def sweep_verdicts(records: list[dict], reference: dict | None) -> ConcurrencySweep:
    v = verdicts.sweep_verdicts(records, reference)
    all_at_once = [r for r in records if r["rate"] is None and not r["faults"]]  # the concurrency curve
    return ConcurrencySweep(
        levels=records,
        corruption_free=v["corruption_free"],
        first_divergence=v["first_divergence"],
        batch_invariant=v["batch_invariant"],
        isolation=v["isolation"],
        saturation_concurrency=figures.saturation_level(
            [r["concurrency"] for r in all_at_once], [r["avg_batch_occupancy"] for r in all_at_once]
        )
        if all_at_once
        else None,
        reference_concurrency=(reference or records[0])["concurrency"],
        reference=reference,
        saturation_rates=backpressure.saturation_rates(records) if reference is not None else None,
    )
