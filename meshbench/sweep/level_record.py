"""A level's results.json record and the sweep's verdicts, built once from the level's passes: each record is
complete when it is built."""

from __future__ import annotations

from typing import Sequence

from meshbench.analysis import backpressure, figures, isolation, prefix, verdicts
from meshbench.analysis.verdicts import ConcurrencySweep
from meshbench.records.context import Budget, Slo
from meshbench.records.model import IsolationRecords, LevelRecord, Reference, Repetition
from meshbench.records.sharing import OwnKvReplay
from meshbench.scheduler.budget import ACCEPTED
from meshbench.sweep.passes import Pass
from meshbench.sweep.plan import Level


def level_record(
    level: Level,
    budget: Budget,
    arrival_times: list[float],
    slo: Slo,
    passes: Sequence[tuple[int, int, Pass]],
    proof: IsolationRecords,
    wall: bool = False,
    cache_off: Pass | None = None,
    near_tie: float = figures.NEAR_TIE,
    block_tokens: int = 0,
    own_kv: OwnKvReplay | None = None,
) -> LevelRecord:
    """The results.json record of a level, complete: repetition 0's deterministic records, every repetition's
    raw timing and wall figures, their summary, and the isolation records (``proof``, from
    ``sweep.prove.isolation_record``) with their verdict. ``passes`` are (repetition, position in its order,
    pass); ``cache_off``: with a prefix cache, the level run with it off (``own_kv``: a conversation level replayed
    on its sessions' own KV where turns differ)."""
    first = passes[0][2]
    ticks = figures.deterministic_ticks(first.ticks)
    repetitions = [
        Repetition(
            repetition=r,
            position=position,
            wall_s=p.wall_s,
            tick_records=p.ticks,
            sessions=p.timing,
            wall=figures.wall_figures(p.timing, p.ticks, p.wall_s),
        )
        for r, position, p in passes
    ]
    # On the wall clock the SLO is in ms: goodput is per second, from the first repetition's stamps.
    load = backpressure.figures(
        first.events, ticks, first.sessions, slo, (first.timing, first.wall_s) if wall else None
    )
    proven = isolation.verdict(proof, first.sessions, ticks)
    return LevelRecord(
        concurrency=level.concurrency,
        arrivals=level.arrivals.label(),
        rate=level.rate,
        budget=budget,
        **figures.summarize_ticks(ticks),
        rejected_admissions=sum(e.decision not in ACCEPTED for e in first.events),
        cache_misses=first.cache_misses,
        failed=first.failed,
        counts=first.counts,
        faults=[f.label for f in level.faults],
        fault_events=first.fault_events,
        engine_losses=first.engine_losses,
        arrival_times=arrival_times,  # ticks, or ms on the wall clock
        submit_events=first.events,
        turn_events=first.turn_events,
        sessions=first.sessions,
        tick_records=ticks,
        backpressure=load,
        repetitions=repetitions,
        wall=figures.repetition_summary([rep.wall for rep in repetitions]),
        isolation=proof,
        isolation_verdict=proven,
        prefix=None if cache_off is None else prefix.stats(first.sessions, ticks, block_tokens),
        cache_off=None if cache_off is None else cache_off.sessions,
        cache_verdict=None
        if cache_off is None
        else prefix.cache_verdict(first.sessions, cache_off.sessions, proven.holds, near_tie, own_kv),
    )


def concurrency_sweep(records: list[LevelRecord], reference: Reference | None, family: str) -> ConcurrencySweep:
    """The sweep's result: its complete level records and the verdicts over them (each level's isolation verdict
    as its record holds it, computed once)."""
    v = verdicts.sweep_verdicts(records, reference, [r.isolation_verdict for r in records], family)
    all_at_once = [r for r in records if r.rate is None and not r.faults]  # the concurrency curve
    return ConcurrencySweep(
        levels=records,
        corruption_free=v.corruption_free,
        first_divergence=v.first_divergence,
        batch_invariant=v.batch_invariant,
        isolation=v.isolation,
        saturation_concurrency=figures.saturation_level(
            [r.concurrency for r in all_at_once], [r.avg_batch_occupancy for r in all_at_once]
        )
        if all_at_once
        else None,
        reference_concurrency=(reference or records[0]).concurrency,
        reference=reference,
        saturation_rates=backpressure.saturation_rates(records) if reference is not None else None,
    )
