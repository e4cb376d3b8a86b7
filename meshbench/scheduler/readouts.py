"""What the scheduler reports upward, read under its lock: its sessions and ticks, its engine losses, and the
node's telemetry. A mixin of ``ContinuousBatchScheduler``, which owns the state; nothing here changes it."""

from __future__ import annotations

import copy
import threading
from collections import Counter, OrderedDict

from meshbench.engine.base import EngineFigures
from meshbench.records.context import Budget
from meshbench.records.model import EngineLoss
from meshbench.records.tick import Tick
from meshbench.scheduler.session import DoneReason, Session
from meshbench.scheduler.telemetry import SchedulerTelemetry


class SchedulerReadouts:
    # The state ContinuousBatchScheduler keeps (its __init__ says what each holds).
    _lock: threading.RLock
    _live: dict[str, Session]
    _queue: OrderedDict[str, Session]
    _admitted: OrderedDict[str, Session]
    _running: dict[str, Session]
    _done: list[Session]
    _last_done: dict[str, Session]
    _done_counts: Counter[str]
    _ticks: list[Tick]
    _rejected: Counter[str]
    _failed_by_cause: Counter[str]
    _prefill_tokens: int
    _decode_tokens: int
    _first_tick_ns: int | None
    _last_tick_end_ns: int | None
    _losses: list[EngineLoss]
    figures: EngineFigures
    budget: Budget
    scratch_per_session: int
    active_cap: int

    def _active_count(self) -> int:
        raise NotImplementedError

    def has_work(self) -> bool:
        with self._lock:
            return bool(self._live)

    def live_count(self) -> int:
        with self._lock:
            return len(self._live)

    def pending_tokens(self) -> int:
        """Positions the live sessions may still write: with the arrivals to come, they bound the ticks."""
        with self._lock:
            return sum(s.request.total_tokens for s in self._live.values())

    def sessions(self) -> list[Session]:
        """Every session accepted so far, ended or not, in arrival order."""
        with self._lock:
            return sorted([*self._done, *self._live.values()], key=lambda s: s.arrival)

    def ticks(self) -> list[Tick]:
        with self._lock:
            return list(self._ticks)

    def tick_count(self) -> int:
        with self._lock:
            return len(self._ticks)

    def session(self, session_id: str) -> Session | None:
        """The live session of that id, else its latest ended one (None: never submitted)."""
        with self._lock:
            return self._live.get(session_id) or self._last_done.get(session_id)

    def running_ids(self) -> list[str]:
        """Sessions prefilled and decoding: the ones whose KV an engine holds."""
        with self._lock:
            return list(self._running)

    def losses(self) -> list[EngineLoss]:
        """One record per engine loss: the tick, the cause, the sessions lost (id, epoch), and the
        resubmissions (id, epoch, decision) when the engine was restarted."""
        with self._lock:
            return copy.deepcopy(self._losses)  # (a record's lists are its own: no holder changes another's)

    def telemetry(self, kv_bytes: int) -> SchedulerTelemetry:
        """The node's figures, with the KV the engine holds now."""
        with self._lock:
            done = self._done_counts
            active = self._active_count()
            batches = [t.decode_batch for t in self._ticks if t.decode_batch]
            scratch = active * self.scratch_per_session
            elapsed = 0.0
            if self._first_tick_ns is not None and self._last_tick_end_ns is not None:
                elapsed = (self._last_tick_end_ns - self._first_tick_ns) / 1e9
            return SchedulerTelemetry(
                active_sessions=active,
                running_sessions=len(self._running),
                queue_depth=len(self._queue),
                effective_active_cap=self.active_cap,
                batch_occupancy_last=self._ticks[-1].decode_batch if self._ticks else 0,
                batch_occupancy_avg=sum(batches) / len(batches) if batches else 0.0,
                batch_occupancy_max=max(batches, default=0),
                kv_bytes=kv_bytes,
                kv_budget_bytes=self.budget.kv_bytes,
                kv_pressure=kv_bytes / self.budget.kv_bytes,
                scratch_bytes=scratch,
                scratch_budget_bytes=self.budget.scratch_bytes,
                scratch_pressure=scratch / self.budget.scratch_bytes,
                weight_bytes=self.figures.weight_bytes,
                weight_budget_bytes=self.budget.weight_bytes,
                prefill_tokens=self._prefill_tokens,
                decode_tokens=self._decode_tokens,
                prefill_tokens_per_s=self._prefill_tokens / elapsed if elapsed > 0 else 0.0,
                decode_tokens_per_s=self._decode_tokens / elapsed if elapsed > 0 else 0.0,
                ticks=len(self._ticks),
                rejected_admissions=sum(self._rejected.values()),
                rejected_by_reason=dict(sorted(self._rejected.items())),
                cache_misses=done.get(DoneReason.CACHE_MISS.value, 0),
                completed=done.get(DoneReason.COMPLETED.value, 0),
                cancelled=done.get(DoneReason.CANCELLED.value, 0),
                failed=done.get(DoneReason.FAILED.value, 0),
                failed_by_cause=dict(sorted(self._failed_by_cause.items())),
                engine_losses=len(self._losses),
                resubmitted=sum(len(r.resubmitted) for r in self._losses),
            )
