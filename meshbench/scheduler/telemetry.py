"""What a node reports upward about its scheduler, and what one tick did."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:
    from meshbench.scheduler.plan import TickPlan
    from meshbench.scheduler.session import Session


@dataclass(frozen=True, slots=True)
class TickRecord:
    """One tick, raw: every derived sweep figure is recomputed from these."""

    tick: int
    decode_batch: int  # sessions in this tick's decode_batch call (0: no call)
    decode_sessions: tuple[str, ...]
    decode_tokens: int  # tokens the decode batch produced (a cache miss produces none)
    prefill_tokens: int
    prefill_sessions: tuple[str, ...]  # sessions whose prompt's last piece ran: their first token came
    prefill_chunks: tuple[tuple[str, int, int], ...]  # (session, first position, tokens) of every piece written
    kv_bytes: int  # KV held at the end of the tick, after its releases
    stored_tokens: int  # positions held by live sessions at the end of the tick
    active: int
    queued: int
    completed: tuple[str, ...]  # sessions that got all their tokens this tick
    admitted: tuple[str, ...]  # queued sessions that took a freed slot at the end of this tick
    ended: tuple[str, ...]  # sessions that ended otherwise (cancelled before it, failed, missed) in it
    resubmitted: tuple[str, ...]  # sessions lost with their engine and submitted again in it (new epoch)
    tick_ns: int  # wall time of the whole tick
    decode_ns: int  # of which in the decode_batch call
    prefill_ns: int  # of which in prefill calls
    # (session, position, token) of every decode item handed to the engine this tick: verify checks the feed
    decode_feed: tuple[tuple[str, int, int], ...] = ()
    # with a prefix cache (None without): prompt positions this tick took from it instead of computing them,
    # and the bytes of its blocks at the end of the tick (part of kv_bytes)
    prefix_hit_tokens: int | None = None
    kv_bytes_shared: int | None = None

    def to_dict(self) -> dict:
        d = asdict(self)
        d["decode_feed"] = [list(f) for f in self.decode_feed]
        d["decode_sessions"] = list(self.decode_sessions)
        d["prefill_sessions"] = list(self.prefill_sessions)
        d["prefill_chunks"] = [list(c) for c in self.prefill_chunks]
        d["completed"] = list(self.completed)
        d["admitted"] = list(self.admitted)
        d["ended"] = list(self.ended)
        d["resubmitted"] = list(self.resubmitted)
        return d


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
) -> TickRecord:
    """The record of a tick that ran ``plan`` (with no engine, nothing was fed)."""
    feed = plan.feed if plan.down is None else []
    return TickRecord(
        tick=plan.tick,
        decode_batch=len(plan.decode),
        decode_sessions=tuple(s.session_id for s in plan.decode),
        decode_tokens=plan.decoded,
        prefill_tokens=sum(n for _, _, n in plan.pieces),
        prefill_sessions=tuple(s.session_id for s in plan.prefilled),
        prefill_chunks=tuple(plan.pieces),
        kv_bytes=kv_bytes,
        stored_tokens=stored_tokens,
        active=active,
        queued=queued,
        completed=tuple(s.session_id for s in plan.finished),
        admitted=tuple(s.session_id for s in plan.promoted),
        ended=tuple(s.session_id for s in ended),
        resubmitted=tuple(s.session_id for s in resubmitted),
        tick_ns=tick_ns,
        decode_ns=plan.decode_ns,
        prefill_ns=plan.prefill_ns,
        decode_feed=tuple((it.session_id, it.position, it.token) for it in feed),
        prefix_hit_tokens=plan.cached if prefix_cache else None,
        kv_bytes_shared=kv_bytes_shared,
    )
