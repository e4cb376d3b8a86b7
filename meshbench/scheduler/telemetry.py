"""What a node reports upward about its scheduler, and what one tick did (``records.tick.Tick``, the one record of
a tick: the scheduler builds it, the sweep keeps it, results.json holds it)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Sequence

from meshbench.records.tick import Tick

if TYPE_CHECKING:
    from meshbench.scheduler.plan import TickPlan
    from meshbench.scheduler.session import Session


@dataclass(frozen=True, slots=True)
class SchedulerTelemetry:
    active_sessions: int
    running_sessions: int
    queue_depth: int
    effective_active_cap: int
    batch_occupancy_last: int
    batch_occupancy_avg: float  # over ticks that ran a decode batch
    batch_occupancy_max: int
    kv_bytes: int
    kv_budget_bytes: int
    kv_pressure: float
    scratch_bytes: int
    scratch_budget_bytes: int
    scratch_pressure: float
    weight_bytes: int
    weight_budget_bytes: int
    prefill_tokens: int
    decode_tokens: int
    prefill_tokens_per_s: float
    decode_tokens_per_s: float
    ticks: int
    rejected_admissions: int
    rejected_by_reason: dict[str, int] = field(default_factory=dict)
    cache_misses: int = 0
    completed: int = 0
    cancelled: int = 0
    failed: int = 0
    failed_by_cause: dict[str, int] = field(default_factory=dict)
    engine_losses: int = 0
    resubmitted: int = 0

    def to_dict(self) -> dict:
        return asdict(self)


def of_plan(
    plan: TickPlan,
    tick_ns: int,
    ended: Sequence[Session],
    resubmitted: Sequence[Session],
    kv_bytes: int,
    stored_tokens: int,
    active: int,
    queued: int,
    kv_bytes_shared: int | None,
    prefix_cache: bool,
) -> Tick:
    """The record of a tick that ran ``plan``, times included (with no engine, nothing was fed)."""
    feed = plan.feed if plan.down is None else []
    return Tick(
        tick=plan.tick,
        decode_batch=len(plan.decode),
        decode_sessions=[s.session_id for s in plan.decode],
        decode_tokens=plan.decoded,
        prefill_tokens=sum(n for _, _, n in plan.pieces),
        prefill_sessions=[s.session_id for s in plan.prefilled],
        prefill_chunks=[[sid, at, n] for sid, at, n in plan.pieces],
        kv_bytes=kv_bytes,
        stored_tokens=stored_tokens,
        active=active,
        queued=queued,
        completed=[s.session_id for s in plan.finished],
        admitted=[s.session_id for s in plan.promoted],
        ended=[s.session_id for s in ended],
        resubmitted=[s.session_id for s in resubmitted],
        tick_ns=tick_ns,
        decode_ns=plan.decode_ns,
        prefill_ns=plan.prefill_ns,
        decode_feed=[[it.session_id, it.position, it.token] for it in feed],
        prefix_hit_tokens=plan.cached if prefix_cache else None,
        kv_bytes_shared=kv_bytes_shared,
    )
