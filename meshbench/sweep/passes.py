"""One pass of one level: submit the requests at their arrivals, run the node to completion, and keep what it
did as raw records (sessions, ticks, stamps, submissions, faults). Every later step reads a ``Pass``."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable, Sequence

from meshbench.analysis import figures
from meshbench.engine.base import BatchEngine
from meshbench.engine.setup import close_engine
from meshbench.records.context import Budget
from meshbench.records.model import EngineLoss, FaultEvent, SessionRecord, SubmitEvent, Timing
from meshbench.records.tick import Tick
from meshbench.scheduler.budget import AdmissionDecision
from meshbench.scheduler.session import GenerationRequest, Session
from meshbench.sweep.driver import NodeDriver, WallClock
from meshbench.sweep.inject import FaultPlan

# The scheduler's own counters, per pass: verify checks each against the raw records.
COUNTERS = ("completed", "cancelled", "failed", "cache_misses", "rejected_admissions", "engine_losses", "resubmitted")


def _finite(x: float | None) -> float | None:
    """JSON has no inf/nan: a margin that is not finite is recorded as null."""
    return x if isinstance(x, (int, float)) and math.isfinite(x) else None


def session_record(s: Session, prefix_cache: bool = False) -> SessionRecord:
    """A session's deterministic record (with a prefix cache, the prompt positions it took from it)."""
    return SessionRecord(
        session_id=s.session_id,
        epoch=s.epoch,
        end_tick=s.end_tick,
        prompt_tokens=s.prompt_len,
        max_new_tokens=s.request.max_new_tokens,
        tokens=list(s.tokens),
        margins=[_finite(m) for m in s.margins],
        digest=figures.token_digest(s.tokens),
        done_reason=s.done_reason.value if s.done_reason else "UNFINISHED",
        error=s.error,
        cached_tokens=s.cached if prefix_cache else None,
    )


def session_timing(s: Session, t0: int) -> Timing:
    """A session's stamps in one repetition, relative to the start of that pass."""
    return Timing(
        session_id=s.session_id,
        epoch=s.epoch,
        digest=figures.token_digest(s.tokens),
        done_reason=s.done_reason.value if s.done_reason else "UNFINISHED",
        submit_ns=s.submit_ns - t0,
        admit_ns=None if s.admit_ns is None else s.admit_ns - t0,
        token_ns=[t - t0 for t in s.token_ns],
    )


@dataclass(slots=True)
class Pass:
    """One run of one level: its deterministic records and its timing."""

    sessions: list[SessionRecord]
    ticks: list[Tick]  # full tick records, timing included
    timing: list[Timing]
    events: list[SubmitEvent]  # one per arrival: tick, session, decision, active and queued at that moment
    wall_s: float
    cache_misses: int
    failed: int
    counts: dict[str, int]  # the scheduler's COUNTERS
    fault_events: list[FaultEvent]  # one per injected fault (meshbench.sweep.inject)
    engine_losses: list[EngineLoss]  # one per engine loss: tick, cause, lost, resubmitted
    turn_events: list[SubmitEvent] | None = None  # conversations: one per later turn submitted


def run_pass(
    requests: Sequence[GenerationRequest],
    arrival_ticks: Sequence[int],
    budget: Budget,
    engine: BatchEngine,
    clock: Callable[[], int] = time.monotonic_ns,
    on_tick: Callable[[Tick], None] | None = None,
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
    events: list[SubmitEvent] = []
    turns: list[SubmitEvent] = []
    t0 = clock()
    try:
        node.run_to_completion(
            on_tick=on_tick,
            arrivals=list(zip(arrival_ticks, requests)),
            on_submit=lambda tick, d, _at, _now: events.append(submit_event(tick, d)),
            before_tick=plan.before_tick,
            on_turn=lambda tick, d, _at, _now: turns.append(submit_event(tick, d)),
        )
    finally:
        if node.engine is not wrapped:  # a restarted engine is this pass's to free
            close_engine(node.engine)
    faults = plan.events(budget.max_active_sessions, len(node.ticks()))
    return finished_pass(node, events, t0, clock(), faults, turns if _conversations(requests) else None)


def submit_event(
    tick: int, d: AdmissionDecision, arrival_ms: float | None = None, submit_ms: float | None = None
) -> SubmitEvent:
    """One arrival's record: the tick before which it was submitted, the decision and the node's state (and on
    the wall clock its arrival and submit times)."""
    return SubmitEvent(
        tick=tick,
        session_id=d.session_id,
        epoch=d.epoch,
        decision=d.reason.value,
        active=d.active_sessions,
        queued=d.queue_depth,
        arrival_ms=arrival_ms,
        submit_ms=submit_ms,
    )


def finished_pass(
    node: NodeDriver,
    events: list[SubmitEvent],
    t0: int,
    t1: int,
    fault_events: list[FaultEvent] | None = None,
    turn_events: list[SubmitEvent] | None = None,
) -> Pass:
    """The raw records of a pass that started at ``t0`` and ended at ``t1`` (clock nanoseconds)."""
    ended = node.sessions()
    tel = node.telemetry().to_dict()
    return Pass(
        [session_record(s, node.sched.prefix_cache) for s in ended],
        node.ticks(),
        [session_timing(s, t0) for s in ended],
        events,
        (t1 - t0) / 1e9,
        tel["cache_misses"],
        tel["failed"],
        {k: tel[k] for k in COUNTERS},
        fault_events or [],
        node.losses(),
        turn_events,
    )


def run_pass_wall(
    requests: Sequence[GenerationRequest],
    arrival_s: Sequence[float],
    budget: Budget,
    engine: BatchEngine,
    clock: Callable[[], int] = time.monotonic_ns,
    on_tick: Callable[[Tick], None] | None = None,
    sleep: Callable[[float], None] = time.sleep,
    prefill: str = "whole",
) -> Pass:
    """The wall clock: a session is submitted once its arrival time has passed (checked before each tick);
    when nothing is live the node sleeps until the next arrival. Ticks run only with live sessions, so
    admission depends on speed: such a pass is reported, not compared by --rerun."""
    node = NodeDriver(engine, budget, clock, prefill_policy=prefill)
    events: list[SubmitEvent] = []
    t0 = clock()

    def submitted(tick: int, d: AdmissionDecision, arrival: float, now: float) -> None:
        events.append(submit_event(tick, d, arrival_ms=arrival * 1e3, submit_ms=now * 1e3))

    turns: list[SubmitEvent] = []
    node.run_to_completion(
        on_tick=on_tick,
        arrivals=list(zip(arrival_s, requests)),
        on_submit=submitted,
        wall=WallClock(t0, sleep),
        on_turn=lambda tick, d, _at, _now: turns.append(submit_event(tick, d)),
    )
    return finished_pass(node, events, t0, clock(), None, turns if _conversations(requests) else None)


def _conversations(requests: Sequence[GenerationRequest]) -> bool:
    """Does the pass run conversations (its turn events then recorded, an empty list where none came)?"""
    return any(r.turns for r in requests)
