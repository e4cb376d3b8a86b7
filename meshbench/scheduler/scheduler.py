"""ContinuousBatchScheduler: bounded admission and decode-first continuous batching. It decides; it never
calls an engine (meshbench.sweep.driver does, and hands back the answers).

A tick is ``schedule`` -> the driver runs the plan's ONE engine call -> ``apply`` -> the driver releases what
ended -> ``record``. ``schedule`` is where the policy reads top to bottom: pick the decode batch (every
decoding session, at most max_batch_size, least-recently-decoded first), then the prefill work
(first-in-first-out within max_prefill_tokens_per_tick: whole prompts, or ``chunked`` pieces that fill the
budget exactly; with ``burst`` or ``chunked-burst``, every waiting prompt in a tick where none decodes).
``apply`` takes each session's answer, then the end-of-tick releases and promotion.

An engine that is lost (its process died) takes the sessions resident in it along: ``engine_lost`` ends
them FAILED with the cause; the driver then restarts the engine and ``resubmit``s them under a new epoch
(from their prompts), or declares the node ``engine_down``: every session that needs the engine later
fails too.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections import Counter, OrderedDict
from typing import Callable, Sequence

from meshbench.engine.base import DecodeItem, EngineFigures, PrefillChunk, SessionHandle, TickResult
from meshbench.errors import MeshbenchError
from meshbench.records.context import Budget
from meshbench.records.model import EngineLoss, Resubmission
from meshbench.records.tick import Tick
from meshbench.scheduler import telemetry
from meshbench.scheduler.budget import AdmissionDecision, AdmissionReason
from meshbench.scheduler.plan import PREFILL_POLICIES, CancelResult, TickPlan, bursts, chunks
from meshbench.scheduler.readouts import SchedulerReadouts
from meshbench.scheduler.session import DoneReason, GenerationRequest, Session, SessionStatus


class ContinuousBatchScheduler(SchedulerReadouts):
    def __init__(
        self,
        figures: EngineFigures,
        budget: Budget,
        clock: Callable[[], int] = time.monotonic_ns,
        prefill_policy: str = "whole",
        prefix_cache: bool = False,
    ) -> None:
        if prefill_policy not in PREFILL_POLICIES:
            raise MeshbenchError(f"prefill must be one of {', '.join(PREFILL_POLICIES)}, got {prefill_policy!r}")
        self.prefill_policy = prefill_policy
        self.prefix_cache = prefix_cache  # the engine reuses cached prompt blocks: each prefill says how many
        self.figures = figures  # the engine's figures the budgets are checked against
        self.budget = budget
        self.clock = clock
        self.scratch_per_session = figures.scratch_bytes_per_session
        self.active_cap = budget.effective_active_cap(self.scratch_per_session)
        self.kv_bytes_per_token = figures.kv_bytes_per_token
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
        self._ticks: list[Tick] = []
        self._rejected: Counter[str] = Counter()
        self._failed_by_cause: Counter[str] = Counter()
        self._prefill_tokens = 0
        self._decode_tokens = 0
        self._first_tick_ns: int | None = None
        self._last_tick_end_ns: int | None = None
        self._losses: list[EngineLoss] = []  # one record per engine loss: tick, cause, lost, resubmitted
        self._down: str | None = None  # the cause, once an engine was lost and not restarted
        self._ended: list[Session] = []  # ended otherwise than completing since the last tick record
        self._resubmitted: list[Session] = []  # resubmitted since the last tick record
        self._releases: list[str] = []  # sessions ended holding KV, for the driver to release in the engine
        self.resubmitted_work = 0  # tokens resubmissions added: they extend the driver's bound on ticks

    # --- admission --------------------------------------------------------------
    def submit(self, request: GenerationRequest) -> AdmissionDecision:
        """Admit, queue or refuse; a refusal changes no state."""
        with self._lock:
            active, queued = self._active_count(), len(self._queue)
            kv_needed = request.total_tokens * self.kv_bytes_per_token
            if request.session_id in self._live:
                reason = AdmissionReason.REJECTED_DUPLICATE
            elif kv_needed > self.budget.kv_bytes:
                reason = AdmissionReason.REJECTED_KV_BUDGET
            elif self.scratch_per_session > self.budget.scratch_bytes:
                reason = AdmissionReason.REJECTED_SCRATCH_BUDGET
            # NOTE: a free slot is taken only when nobody is queued: no arrival overtakes a queued one (FIFO).
            elif active < self.active_cap and queued == 0:
                reason = AdmissionReason.ADMITTED
            elif queued < self.budget.max_queue_depth:
                reason = AdmissionReason.QUEUED
            else:
                reason = AdmissionReason.REJECTED_QUEUE_FULL  # the backpressure signal
            epoch = None
            if reason.accepted:
                self._accept(request, admitted=reason is AdmissionReason.ADMITTED)
                epoch = self._epochs[request.session_id]
            else:
                self._rejected[reason.value] += 1
            return AdmissionDecision(
                session_id=request.session_id,
                reason=reason,
                kv_needed_bytes=kv_needed,
                kv_budget_bytes=self.budget.kv_bytes,
                scratch_needed_bytes=self.scratch_per_session,
                scratch_budget_bytes=self.budget.scratch_bytes,
                active_sessions=active,
                active_cap=self.active_cap,
                queue_depth=queued,
                max_queue_depth=self.budget.max_queue_depth,
                epoch=epoch,
            )

    def cancel(self, session_id: str) -> CancelResult:
        """End a queued or active session as CANCELLED and free its slot now (its KV: ``take_releases``)."""
        with self._lock:
            s = self._live.get(session_id)
            if s is None:
                ended = self._last_done.get(session_id)
                if ended is None:
                    return CancelResult(session_id, False, "unknown session")
                why = ended.done_reason.value if ended.done_reason is not None else "unknown"
                return CancelResult(session_id, False, f"already finished: {why}")
            self._end(s, DoneReason.CANCELLED)
            self._promote(next_tick=len(self._ticks))
            return CancelResult(session_id, True, "cancelled")

    # --- the policy ---------------------------------------------------------------
    def schedule(self) -> TickPlan:
        """The tick's decisions: the decode batch, then the prefill work within the budget. The driver runs
        both in ONE engine call and hands the answer to ``apply``."""
        with self._lock:
            t0 = self.clock()
            if self._first_tick_ns is None:
                self._first_tick_ns = t0
            chosen = self._pick_decode(self.budget.max_batch_size)
            picks = self._pick_prefill(self.prefill_budget(decoding=bool(chosen)))
            chunks = [
                PrefillChunk(
                    SessionHandle(s.session_id, s.epoch, s.request.total_tokens),
                    s.request.prompt_tokens[start : start + n],
                    start,
                    start + n == s.prompt_len,
                )
                for s, start, n in picks
            ]
            feed = [self._decode_item(s) for s in chosen]
            return TickPlan(len(self._ticks), t0, chosen, picks, self._down, feed, chunks)

    def apply(self, plan: TickPlan, result: TickResult | None, decode_ns: int = 0, prefill_ns: int = 0) -> list[str]:
        """The engine's answer to ``plan`` (None: the engine was lost in the call, ``engine_lost`` said so):
        each session's token, cache miss or failure; then end-of-tick releases and promotion. Returns the
        sessions whose KV the driver must now release in the engine (then ``record``)."""
        with self._lock:
            plan.decode_ns, plan.prefill_ns = decode_ns, prefill_ns
            plan.decoded = self._apply_decode(plan.tick, plan.decode, result)
            plan.prefilled, plan.pieces = self._apply_prefill(plan, result)
            plan.finished, plan.promoted = self._end_of_tick(plan.tick, [*plan.decode, *plan.prefilled])
            return self.take_releases()

    def record(self, plan: TickPlan, kv_bytes: int, kv_bytes_shared: int | None = None) -> Tick:
        """The tick's record, with the KV the engine holds after its releases (and of it, its prefix cache's)."""
        with self._lock:
            rec = self._record(plan, kv_bytes, kv_bytes_shared)
            self._ticks.append(rec)
            return rec

    @staticmethod
    def _decode_item(s: Session) -> DecodeItem:
        """What a decoding session feeds the engine: its last token at the position after what it holds."""
        return DecodeItem(s.session_id, s.epoch, s.position, s.tokens[-1])

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

    def prefill_budget(self, decoding: bool) -> int:
        """The tick's prefill tokens: the budget, which bounds how long a tick stalls the decoding sessions; with
        ``burst`` or ``chunked-burst``, unbounded in a tick where none decodes (the server's way: every waiting
        prompt in one go)."""
        if bursts(self.prefill_policy) and not decoding:
            return sum(s.prompt_len - s.prefilled for s in self._admitted.values())
        return self.budget.max_prefill_tokens_per_tick

    def _pick_prefill(self, token_budget: int) -> list[tuple[Session, int, int]]:
        """(session, first position, tokens) to prefill, first in first out within ``token_budget``.

        ``whole`` (and ``burst``, its budget from ``prefill_budget``): whole prompts while they fit; the first
        always runs, so one prompt larger than the budget still progresses; the first that does not fit ends the
        phase (no reordering: a smaller prompt behind it waits too). ``chunked``: the budget filled exactly, the
        last prompt split and continued next tick at its next position.
        """
        picks: list[tuple[Session, int, int]] = []
        spent = 0
        for s in self._admitted.values():
            left = s.prompt_len - s.prefilled
            if chunks(self.prefill_policy):
                left = min(left, token_budget - spent)
                if left <= 0:
                    break
            elif picks and spent + left > token_budget:
                break
            picks.append((s, s.prefilled, left))
            spent += left
        return picks

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
                self._fail(s, r.error, r.cause)
            elif r.cache_miss:
                self._end(s, DoneReason.CACHE_MISS)
            else:
                assert r.token is not None, s.session_id  # (an engine's answer without error or miss has a token)
                s.add_token(r.token, r.margin, now, r.runner_up)
                decoded += 1
        self._decode_tokens += decoded
        return decoded

    def _apply_prefill(self, plan: TickPlan, result: TickResult | None):
        """Each chunk's answer: its positions are held (any from a prefix cache counted); a prompt's last chunk
        gives the first token, and the session decodes. Returns those sessions and the pieces written."""
        chunks = plan.prefill
        if result is None:
            return [], []
        assert len(result.prefill) == len(chunks), (len(result.prefill), len(chunks))
        prefilled, pieces = [], []
        for (s, start, n), r in zip(chunks, result.prefill):
            if r.error is not None:
                self._fail(s, r.error, r.cause)
                continue
            if r.cache_miss:  # its earlier chunks were evicted under KV pressure
                self._end(s, DoneReason.CACHE_MISS)
                continue
            s.prefilled = start + n
            pieces.append((s.session_id, start, n))
            self._prefill_tokens += n
            if r.cached:
                assert self.prefix_cache and start == 0 and r.cached <= n, (s.session_id, start, n, r.cached)
                s.cached += r.cached
                plan.cached += r.cached
            if s.prefilled == s.prompt_len:
                del self._admitted[s.session_id]
                s.status = SessionStatus.RUNNING
                self._running[s.session_id] = s
                assert r.token is not None, s.session_id  # (a prompt's last chunk gives its first token)
                s.add_token(r.token, r.margin, self.clock(), r.runner_up)
                prefilled.append(s)
        return prefilled, pieces

    def _end_of_tick(self, tick: int, touched: list[Session]) -> tuple[list[Session], list[Session]]:
        """Sessions that got their last token this tick free KV and slot; queued ones take the slots.

        Returns the finished sessions and the promoted ones (prefillable from the next tick).
        """
        finished = sorted(
            (s for s in touched if s.status is SessionStatus.RUNNING and s.has_all_tokens), key=lambda s: s.arrival
        )
        for s in finished:
            self._end(s, DoneReason.COMPLETED)
        return finished, self._promote(next_tick=tick + 1)

    def _record(self, plan: TickPlan, kv_bytes: int, kv_bytes_shared: int | None) -> Tick:
        t1 = self.clock()
        self._last_tick_end_ns = t1
        ended, self._ended = self._ended, []
        resubmitted, self._resubmitted = self._resubmitted, []
        stored = sum(s.prompt_len + len(s.tokens) - 1 for s in self._running.values()) + sum(
            s.prefilled for s in self._admitted.values()
        )
        return telemetry.of_plan(
            plan, t1 - plan.started_ns, ended, resubmitted, kv_bytes, stored, self._active_count(), len(self._queue),
            kv_bytes_shared if self.prefix_cache else None, self.prefix_cache,
        )  # fmt: skip

    # --- an engine lost -------------------------------------------------------------
    def engine_lost(self, plan: TickPlan, cause: str) -> list[Session]:
        """The engine's process is gone in ``plan``'s call: the sessions resident in it (running, or in the
        call) end FAILED with the cause, their KV gone with it. Returns them, in arrival order; the driver
        then restarts the engine and ``resubmit``s them, or declares ``engine_down``."""
        with self._lock:
            in_call = [*plan.decode, *(s for s, _, _ in plan.prefill)]
            resident = [*self._running.values(), *(s for s in self._admitted.values() if s.prefilled), *in_call]
            lost = sorted({id(s): s for s in resident}.values(), key=lambda s: s.arrival)
            for s in lost:
                self._failed_by_cause[cause] += 1
                self._end(s, DoneReason.FAILED, cause)
            self._losses.append(
                EngineLoss(tick=plan.tick, cause=cause, lost=[[s.session_id, s.epoch] for s in lost], resubmitted=[])
            )
            return lost

    def engine_down(self, cause: str, restart_error: str | None = None) -> None:
        """No engine any more (not restarted, or its restart failed): every session that needs it fails."""
        with self._lock:
            self._down = cause
            if restart_error is not None:
                self._losses[-1] = dataclasses.replace(self._losses[-1], restart_error=restart_error)

    def resubmit(self, lost: Sequence[Session]) -> None:
        """The lost sessions again, from their prompts, under a new epoch, through admission like any arrival."""
        with self._lock:
            done = []
            for s in lost:
                d = self.submit(s.request)
                done.append(Resubmission(session_id=s.session_id, epoch=d.epoch, decision=d.reason.value))
                if d.reason.accepted:
                    self._resubmitted.append(self._live[s.session_id])
                    self.resubmitted_work += s.request.total_tokens
            record = self._losses[-1]
            self._losses[-1] = dataclasses.replace(record, resubmitted=[*record.resubmitted, *done])

    def take_releases(self) -> list[str]:
        """The sessions that ended holding KV since the last call, in the order they ended."""
        with self._lock:
            out, self._releases = self._releases, []
            return out

    def release_failed(self, exc: Exception) -> None:
        """A release the engine refused: counted by its type (the node stays up)."""
        with self._lock:
            self._failed_by_cause[f"release: {type(exc).__name__}"] += 1

    # --- internals ----------------------------------------------------------------
    def _active_count(self) -> int:
        """Sessions holding a slot: admitted (awaiting prefill) or running."""
        return len(self._admitted) + len(self._running)

    def _accept(self, request: GenerationRequest, admitted: bool) -> None:
        self._epochs[request.session_id] += 1
        now = self.clock()
        s = Session(
            request,
            self._arrivals,
            self._epochs[request.session_id],
            now,
            status=SessionStatus.ADMITTED if admitted else SessionStatus.QUEUED,
            admit_ns=now if admitted else None,
            admit_tick=len(self._ticks) if admitted else None,
        )
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
        """End a session: out of its stage, counted; if the engine may hold its KV, it is to be released."""
        had_kv = s.status is SessionStatus.RUNNING or s.prefilled > 0 or reason is DoneReason.FAILED
        {
            SessionStatus.QUEUED: self._queue,
            SessionStatus.ADMITTED: self._admitted,
            SessionStatus.RUNNING: self._running,
        }[s.status].pop(s.session_id)
        s.finish(reason, error)
        s.end_tick = len(self._ticks)
        if reason is not DoneReason.COMPLETED:
            self._ended.append(s)
        del self._live[s.session_id]
        self._done.append(s)
        self._last_done[s.session_id] = s
        self._done_counts[reason.value] += 1
        if had_kv:
            self._releases.append(s.session_id)

    def _fail(self, s: Session, error: str, cause: str | None) -> None:
        """End a session FAILED with the engine's error, counted by its cause (where and what type, or the
        lost engine's cause)."""
        self._failed_by_cause[cause or error] += 1
        self._end(s, DoneReason.FAILED, error)
