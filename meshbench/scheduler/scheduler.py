"""ContinuousBatchScheduler: bounded admission and decode-first continuous batching.

The whole policy is ``run_tick``, with the budgets passed in from it: pick the decode batch (every
decoding session, at most max_batch_size, least-recently-decoded first), then the prefill work
(first-in-first-out within max_prefill_tokens_per_tick: whole prompts, or ``chunked`` pieces that
fill the budget exactly), run both in ONE engine call (``step``), apply its answers, then
end-of-tick releases and promotion.

An engine that is lost (``EngineLost``: its process died) takes the sessions resident in it
along: they end FAILED with the cause. With a ``recover`` policy the scheduler then runs on a
fresh engine and submits the lost sessions again under a new epoch (from their prompts);
without one the node stays up and every session that needs the engine later fails too.
"""

from __future__ import annotations

import threading
import time
from collections import Counter, OrderedDict
from dataclasses import dataclass
from typing import Callable, Sequence

from meshbench.engine.base import (
    BatchEngine,
    DecodeItem,
    EngineLost,
    PrefillChunk,
    SessionHandle,
    StepResult,
    TickResult,
    engine_step,
)
from meshbench.errors import MeshbenchError
from meshbench.scheduler.budget import AdmissionDecision, AdmissionReason, NodeBudget
from meshbench.scheduler.session import DoneReason, GenerationRequest, Session, SessionStatus
from meshbench.scheduler.telemetry import SchedulerTelemetry, TickRecord

PREFILL_POLICIES = ("whole", "chunked")


@dataclass(frozen=True, slots=True)
class CancelResult:
    session_id: str
    cancelled: bool
    detail: str  # "cancelled", "unknown session", "already finished: COMPLETED", ...


class ContinuousBatchScheduler:
    def __init__(
        self,
        engine: BatchEngine,
        budget: NodeBudget,
        clock: Callable[[], int] = time.monotonic_ns,
        recover: Callable[[], BatchEngine] | None = None,
        prefill_policy: str = "whole",
    ) -> None:
        if prefill_policy not in PREFILL_POLICIES:
            raise MeshbenchError(f"prefill must be one of {', '.join(PREFILL_POLICIES)}, got {prefill_policy!r}")
        self.prefill_policy = prefill_policy
        self.engine = engine
        self.recover = recover  # the restart policy: a fresh engine after a loss (None: no restart)
        self.budget = budget
        self.clock = clock
        self.scratch_per_session = engine.scratch_bytes_per_session
        self.active_cap = budget.effective_active_cap(self.scratch_per_session)
        self.kv_bytes_per_token = engine.kv_bytes_per_token
        self._lock = threading.RLock()
        # Live sessions by id, and each lifecycle stage in its own ordered container, so a
        # tick costs O(running + prefills), never O(everything queued).
        self._live: dict[str, Session] = {}
        self._queue: OrderedDict[str, Session] = OrderedDict()  # QUEUED, first come first served
        self._admitted: OrderedDict[str, Session] = OrderedDict()  # ADMITTED: a slot, awaiting prefill
        self._running: dict[str, Session] = {}  # RUNNING: prefilled, decoding
        self._done: list[Session] = []  # every ended session (a resubmitted id appears once per epoch)
        self._last_done: dict[str, Session] = {}  # the latest ended session of each id
        self._done_counts: Counter[str] = Counter()  # by DoneReason value
        self._arrivals = 0
        self._epochs: Counter[str] = Counter()
        self._ticks: list[TickRecord] = []
        self._rejected: Counter[str] = Counter()
        self._failed_by_cause: Counter[str] = Counter()
        self._prefill_tokens = 0
        self._decode_tokens = 0
        self._first_tick_ns: int | None = None
        self._last_tick_end_ns: int | None = None
        self._losses: list[dict] = []  # one record per engine loss: tick, cause, lost, resubmitted
        self._down: str | None = None  # the cause, once an engine was lost and not restarted
        self._ended: list[Session] = []  # ended otherwise than completing since the last tick record
        self._resubmitted: list[Session] = []  # resubmitted since the last tick record
        self._resubmitted_work = 0  # tokens resubmissions added: they extend run_to_completion's bound

    # --- admission --------------------------------------------------------------
    def submit(self, request: GenerationRequest) -> AdmissionDecision:
        """Admit, queue or refuse; a refusal changes no state."""
        with self._lock:
            active, queued = self._active_count(), len(self._queue)
            kv_needed = request.total_tokens * self.kv_bytes_per_token
            decision = dict(
                session_id=request.session_id,
                kv_needed_bytes=kv_needed, kv_budget_bytes=self.budget.kv_bytes,
                scratch_needed_bytes=self.scratch_per_session, scratch_budget_bytes=self.budget.scratch_bytes,
                active_sessions=active, active_cap=self.active_cap,
                queue_depth=queued, max_queue_depth=self.budget.max_queue_depth,
            )
            if request.session_id in self._live:
                reason = AdmissionReason.REJECTED_DUPLICATE
            elif kv_needed > self.budget.kv_bytes:
                reason = AdmissionReason.REJECTED_KV_BUDGET
            elif self.scratch_per_session > self.budget.scratch_bytes:
                reason = AdmissionReason.REJECTED_SCRATCH_BUDGET
            # NOTE: a free slot is taken only when nobody is queued, so a new arrival never
            # overtakes a queued one (first come, first served).
            elif active < self.active_cap and queued == 0:
                reason = AdmissionReason.ADMITTED
            elif queued < self.budget.max_queue_depth:
                reason = AdmissionReason.QUEUED
            else:
                reason = AdmissionReason.REJECTED_QUEUE_FULL  # the backpressure signal
            if reason.accepted:
                self._accept(request, admitted=reason is AdmissionReason.ADMITTED)
                decision["epoch"] = self._epochs[request.session_id]
            else:
                self._rejected[reason.value] += 1
            return AdmissionDecision(reason=reason, **decision)

    def cancel(self, session_id: str) -> CancelResult:
        """End a queued or active session as CANCELLED and free its KV and slot now."""
        with self._lock:
            s = self._live.get(session_id)
            if s is None:
                ended = self._last_done.get(session_id)
                if ended is None:
                    return CancelResult(session_id, False, "unknown session")
                return CancelResult(session_id, False, f"already finished: {ended.done_reason.value}")
            self._end(s, DoneReason.CANCELLED)
            self._promote(next_tick=len(self._ticks))
            return CancelResult(session_id, True, "cancelled")

    # --- the policy ---------------------------------------------------------------
    def run_tick(self) -> TickRecord:
        """One tick: choose the decode batch, then the prefill work within the budget; ONE engine call
        runs both; then end-of-tick releases; then record it."""
        with self._lock:
            t0 = self.clock()
            if self._first_tick_ns is None:
                self._first_tick_ns = t0
            tick = len(self._ticks)
            chosen = self._pick_decode(self.budget.max_batch_size)
            chunks = self._pick_prefill(self.budget.max_prefill_tokens_per_tick)
            items = [self._decode_item(s) for s in chosen]  # the feed: what the engine is given, and recorded
            fed = items if self._down is None else []
            result, decode_ns, prefill_ns = self._step(tick, chosen, items, chunks)
            decoded = self._apply_decode(tick, chosen, result)
            prefilled, pieces = self._apply_prefill(chunks, result)
            finished, promoted = self._end_of_tick(tick, [*chosen, *prefilled])
            rec = self._record(tick, t0, chosen, decoded, prefilled, pieces, finished, promoted, decode_ns,
                               prefill_ns, fed)
            self._ticks.append(rec)
            return rec

    def _pick_decode(self, max_batch: int) -> list[Session]:
        """Every running session, at most ``max_batch`` of them, in arrival order: the decode batch."""
        chosen = list(self._running.values())
        if len(chosen) > max_batch:
            # NOTE: when more sessions decode than a batch holds, the least recently decoded
            # go first, so none starves; then the one with fewer tokens, then arrival order.
            chosen.sort(key=lambda s: (s.last_decode_tick, len(s.tokens), s.arrival))
            chosen = chosen[:max_batch]
        chosen.sort(key=lambda s: s.arrival)
        return chosen

    def _pick_prefill(self, token_budget: int) -> list[tuple[Session, int, int]]:
        """(session, first position, tokens) to prefill, first in first out within ``token_budget``.

        ``whole``: whole prompts while they fit; the first always runs, so one prompt larger than the
        budget still progresses; the first that does not fit ends the phase (no reordering: a smaller
        prompt behind it waits too). ``chunked``: the budget filled exactly, the last prompt split and
        continued next tick at its next position.
        """
        picks: list[tuple[Session, int, int]] = []
        spent = 0
        for s in self._admitted.values():
            left = s.prompt_len - s.prefilled
            if self.prefill_policy == "chunked":
                left = min(left, token_budget - spent)
                if left <= 0:
                    break
            elif picks and spent + left > token_budget:
                break
            picks.append((s, s.prefilled, left))
            spent += left
        return picks

    def _step(self, tick: int, chosen: list[Session], items: list[DecodeItem], chunks: list[tuple[Session, int, int]]):
        """The tick's one engine call. Returns its TickResult (None: the engine was lost in it) and the
        time the decode and the prefill waited (the call's own overhead counts as the decode's)."""
        if self._down is not None:  # no engine any more: nothing to prefill on
            why = f"{self._down} (not restarted)"
            return TickResult([], [StepResult(s.session_id, None, error=why) for s, _, _ in chunks]), 0, 0
        if not chosen and not chunks:
            return TickResult(), 0, 0
        pieces = [PrefillChunk(SessionHandle(s.session_id, s.epoch, s.request.total_tokens),
                               s.request.prompt_tokens[start:start + n], start, start + n == s.prompt_len)
                  for s, start, n in chunks]
        e0 = self.clock()
        try:
            result = engine_step(self.engine, items, pieces)
        except EngineLost as exc:
            ns = self.clock() - e0
            self._engine_lost(tick, [*chosen, *(s for s, _, _ in chunks)], exc)
            return None, ns if chosen else 0, 0 if chosen else ns
        except Exception as exc:  # a step that raised as a whole: every session in it fails
            why = f"step: {type(exc).__name__}: {exc}"
            result = TickResult([StepResult(it.session_id, None, error=why) for it in items],
                                [StepResult(c.session.session_id, None, error=why) for c in pieces])
        ns = self.clock() - e0
        prefill_ns = min(result.prefill_ns, ns) if chosen else ns
        return result, ns - prefill_ns, prefill_ns

    @staticmethod
    def _decode_item(s: Session) -> DecodeItem:
        """What a decoding session feeds the engine: its last token at the position after what it holds."""
        return DecodeItem(s.session_id, s.epoch, s.position, s.tokens[-1])

    def _apply_decode(self, tick: int, chosen: list[Session], result: TickResult | None) -> int:
        """Each decoding session's answer: a token, a cache miss, or the failure of its call."""
        if result is None:
            return 0
        assert len(result.decode) == len(chosen), (len(result.decode), len(chosen))
        now, decoded = self.clock(), 0
        for s, r in zip(chosen, result.decode):
            assert r.session_id == s.session_id, (r.session_id, s.session_id)
            s.last_decode_tick = tick
            if r.error is not None:
                self._fail(s, r.error)
            elif r.cache_miss:
                self._end(s, DoneReason.CACHE_MISS)
            else:
                s.add_token(r.token, r.margin, now)
                decoded += 1
        self._decode_tokens += decoded
        return decoded

    def _apply_prefill(self, chunks: list[tuple[Session, int, int]], result: TickResult | None):
        """Each chunk's answer: its positions are held; a prompt's last chunk gives the first token and the
        session starts decoding. Returns those sessions and the (session, start, tokens) pieces written."""
        if result is None:
            return [], []
        assert len(result.prefill) == len(chunks), (len(result.prefill), len(chunks))
        prefilled, pieces = [], []
        for (s, start, n), r in zip(chunks, result.prefill):
            if r.error is not None:
                self._fail(s, r.error)
                continue
            if r.cache_miss:  # its earlier chunks were evicted under KV pressure
                self._end(s, DoneReason.CACHE_MISS)
                continue
            s.prefilled = start + n
            pieces.append((s.session_id, start, n))
            self._prefill_tokens += n
            if s.prefilled == s.prompt_len:
                del self._admitted[s.session_id]
                s.status = SessionStatus.RUNNING
                self._running[s.session_id] = s
                s.add_token(r.token, r.margin, self.clock())
                prefilled.append(s)
        return prefilled, pieces

    def _end_of_tick(self, tick: int, touched: list[Session]) -> tuple[list[Session], list[Session]]:
        """Sessions that got their last token this tick free KV and slot; queued ones take the slots.

        Returns the finished sessions and the promoted ones (prefillable from the next tick).
        """
        finished = sorted((s for s in touched if s.status is SessionStatus.RUNNING and s.has_all_tokens),
                          key=lambda s: s.arrival)
        for s in finished:
            self._end(s, DoneReason.COMPLETED)
        return finished, self._promote(next_tick=tick + 1)

    def _record(self, tick: int, t0: int, chosen: list[Session], decoded: int, prefilled: list[Session],
                pieces: list[tuple[str, int, int]], finished: list[Session], promoted: list[Session],
                decode_ns: int, prefill_ns: int, feed: list[DecodeItem]) -> TickRecord:
        t1 = self.clock()
        self._last_tick_end_ns = t1
        ended, self._ended = self._ended, []
        resubmitted, self._resubmitted = self._resubmitted, []
        return TickRecord(
            tick=tick,
            decode_batch=len(chosen),
            decode_sessions=tuple(s.session_id for s in chosen),
            decode_tokens=decoded,
            prefill_tokens=sum(n for _, _, n in pieces),
            prefill_sessions=tuple(s.session_id for s in prefilled),
            prefill_chunks=tuple(pieces),
            kv_bytes=self.engine.kv_bytes_in_use,
            stored_tokens=(sum(s.prompt_len + len(s.tokens) - 1 for s in self._running.values())
                           + sum(s.prefilled for s in self._admitted.values())),
            active=self._active_count(),
            queued=len(self._queue),
            completed=tuple(s.session_id for s in finished),
            admitted=tuple(s.session_id for s in promoted),
            ended=tuple(s.session_id for s in ended),
            resubmitted=tuple(s.session_id for s in resubmitted),
            tick_ns=t1 - t0,
            decode_ns=decode_ns,
            prefill_ns=prefill_ns,
            decode_feed=tuple((it.session_id, it.position, it.token) for it in feed),
        )

    def run_to_completion(
        self,
        max_ticks: int | None = None,
        on_tick: Callable[[TickRecord], None] | None = None,
        arrivals: Sequence[tuple[int, GenerationRequest]] = (),
        on_submit: Callable[[int, AdmissionDecision], None] | None = None,
        before_tick: Callable[[int], None] | None = None,
    ) -> list[TickRecord]:
        """Tick until no session waits, runs or is still to arrive; ``on_tick`` sees every tick's record.

        ``arrivals`` are (tick, request) pairs counted from the first tick of this call: before
        that tick runs, the request is submitted (in the given order), and ``on_submit`` sees the
        decision. A tick with nothing live still runs while arrivals remain (the node idles).
        ``before_tick`` then sees the tick's number (a fault plan acts there), before it runs.
        Bounded: admission only accepts sessions that fit a slot and a free slot always goes to
        the queue, so every tick with live sessions prefills or decodes at least one token
        (asserted); the last arrival plus the pending tokens bound the ticks. Running past the
        bound (``max_ticks``, or sessions submitted from outside during the run) raises MeshbenchError.
        """
        with self._lock:
            start = len(self._ticks)
            schedule = sorted(((t, i, r) for i, (t, r) in enumerate(arrivals)), key=lambda x: (x[0], x[1]))
            # Every tick with live sessions writes a prompt position or a token, or ends a session.
            pending = (sum(s.request.total_tokens for s in self._live.values())
                       + sum(r.total_tokens for _, _, r in schedule))
            bound = max_ticks if max_ticks is not None else max((t for t, _, _ in schedule), default=0) + pending + 1
            k = 0
            while self.has_work() or k < len(schedule):
                tick = len(self._ticks) - start
                if tick >= bound + self._resubmitted_work:
                    raise MeshbenchError(f"scheduler did not finish within {bound} ticks")
                while k < len(schedule) and schedule[k][0] <= tick:
                    decision = self.submit(schedule[k][2])
                    if on_submit is not None:
                        on_submit(tick, decision)
                    k += 1
                if before_tick is not None:
                    before_tick(tick)
                live_before = len(self._live)
                rec = self.run_tick()
                assert (not live_before or rec.decode_batch or rec.prefill_chunks or rec.ended
                        or len(self._live) < live_before), (
                    f"a tick made no progress with {len(self._live)} live sessions (active cap {self.active_cap})")
                if on_tick is not None:
                    on_tick(rec)
            return self._ticks[start:]

    # --- read-outs ----------------------------------------------------------------
    def has_work(self) -> bool:
        with self._lock:
            return bool(self._live)

    def sessions(self) -> list[Session]:
        """Every session accepted so far, ended or not, in arrival order."""
        with self._lock:
            return sorted([*self._done, *self._live.values()], key=lambda s: s.arrival)

    def ticks(self) -> list[TickRecord]:
        with self._lock:
            return list(self._ticks)

    def session(self, session_id: str) -> Session | None:
        """The live session of that id, else its latest ended one (None: never submitted)."""
        with self._lock:
            return self._live.get(session_id) or self._last_done.get(session_id)

    def running_ids(self) -> list[str]:
        """Sessions prefilled and decoding: the ones whose KV an engine holds."""
        with self._lock:
            return list(self._running)

    def losses(self) -> list[dict]:
        """One record per engine loss: the tick, the cause, the sessions lost (id, epoch), and the
        resubmissions (id, epoch, decision) when the scheduler recovered."""
        with self._lock:
            return [dict(r) for r in self._losses]

    def telemetry(self) -> SchedulerTelemetry:
        with self._lock:
            done = self._done_counts
            active = self._active_count()
            batches = [t.decode_batch for t in self._ticks if t.decode_batch]
            kv = self.engine.kv_bytes_in_use
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
                kv_bytes=kv,
                kv_budget_bytes=self.budget.kv_bytes,
                kv_pressure=kv / self.budget.kv_bytes,
                scratch_bytes=scratch,
                scratch_budget_bytes=self.budget.scratch_bytes,
                scratch_pressure=scratch / self.budget.scratch_bytes,
                weight_bytes=self.engine.weight_bytes,
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
                resubmitted=sum(len(r["resubmitted"]) for r in self._losses),
            )

    # --- internals ----------------------------------------------------------------
    def _active_count(self) -> int:
        """Sessions holding a slot: admitted (awaiting prefill) or running."""
        return len(self._admitted) + len(self._running)

    def _accept(self, request: GenerationRequest, admitted: bool) -> None:
        self._epochs[request.session_id] += 1
        now = self.clock()
        s = Session(request, self._arrivals, self._epochs[request.session_id], now,
                    status=SessionStatus.ADMITTED if admitted else SessionStatus.QUEUED,
                    admit_ns=now if admitted else None, admit_tick=len(self._ticks) if admitted else None)
        self._arrivals += 1
        self._live[s.session_id] = s
        (self._admitted if admitted else self._queue)[s.session_id] = s

    def _promote(self, next_tick: int) -> list[Session]:
        """Hand free slots to queued sessions, oldest first; they can be prefilled from ``next_tick``."""
        promoted = []
        while self._queue and self._active_count() < self.active_cap:
            _, s = self._queue.popitem(last=False)
            s.status = SessionStatus.ADMITTED
            s.admit_ns, s.admit_tick = self.clock(), next_tick
            self._admitted[s.session_id] = s
            promoted.append(s)
        return promoted

    def _end(self, s: Session, reason: DoneReason, error: str | None = None) -> None:
        had_kv = s.status is SessionStatus.RUNNING or s.prefilled > 0 or reason is DoneReason.FAILED
        {SessionStatus.QUEUED: self._queue, SessionStatus.ADMITTED: self._admitted,
         SessionStatus.RUNNING: self._running}[s.status].pop(s.session_id)
        s.finish(reason, error)
        s.end_tick = len(self._ticks)
        if reason is not DoneReason.COMPLETED:
            self._ended.append(s)
        del self._live[s.session_id]
        self._done.append(s)
        self._last_done[s.session_id] = s
        self._done_counts[reason.value] += 1
        if had_kv:
            try:
                self.engine.release(s.session_id)
            except EngineLost:
                pass  # its KV went with the process; the next engine call reports the loss
            except Exception as exc:  # a release fault must not take the node down either
                self._failed_by_cause[f"release: {type(exc).__name__}"] += 1

    def _engine_lost(self, tick: int, in_call: Sequence[Session], exc: EngineLost) -> None:
        """The engine's process is gone: the sessions resident in it (running, or in the failed call)
        end FAILED with the cause, their KV gone with it; then recover, or stay down."""
        resident = [*self._running.values(), *(s for s in self._admitted.values() if s.prefilled), *in_call]
        lost = sorted({id(s): s for s in resident}.values(), key=lambda s: s.arrival)
        cause = str(exc)
        for s in lost:
            self._failed_by_cause[cause] += 1
            self._end(s, DoneReason.FAILED, cause)
        record = {"tick": tick, "cause": cause, "lost": [[s.session_id, s.epoch] for s in lost], "resubmitted": []}
        self._losses.append(record)
        if self.recover is None:
            self._down = cause
            return
        try:
            self.engine = self.recover()
        except Exception as e:  # the node stays up without an engine: the rest fails, it does not hang
            self._down = f"{cause}; restart failed: {e}"
            record["restart_error"] = str(e)
            return
        for s in lost:  # from the prompt, under a new epoch, through admission like any arrival
            d = self.submit(s.request)
            record["resubmitted"].append({"session_id": s.session_id, "epoch": d.epoch, "decision": d.reason.value})
            if d.reason.accepted:
                self._resubmitted.append(self._live[s.session_id])
                self._resubmitted_work += s.request.total_tokens

    def _fail(self, s: Session, error: str) -> None:
        """End a session FAILED with the engine's error ("decode_batch: Type: message"), counted by cause
        (where and type, or the lost engine's cause)."""
        self._failed_by_cause[": ".join(error.removesuffix(" (not restarted)").split(": ")[:2])] += 1
        self._end(s, DoneReason.FAILED, error)
