"""The node's driver: the scheduler decides, the driver carries out.

One loop for both clocks (``run_to_completion``): before each tick it submits what has arrived (on the
tick clock, arrivals are tick numbers; on the wall clock, seconds since the pass began, and an idle node
sleeps until the next one), lets a fault plan act, then runs the tick: the scheduler's plan, its ONE
engine call, the answers back to the scheduler, the releases of what ended, the tick's record. The
driver owns the engine: it turns the call's exceptions into failed sessions, and after a loss restarts
the engine (``recover``) and has the scheduler resubmit the lost sessions, or leaves the node down.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Callable, Sequence

from meshbench.engine.base import BatchEngine, EngineFigures, EngineLost, TickResult, failure, raised
from meshbench.errors import MeshbenchError
from meshbench.records.context import Budget
from meshbench.records.model import EngineLoss
from meshbench.records.tick import Tick
from meshbench.scheduler.budget import AdmissionDecision
from meshbench.scheduler.plan import CancelResult, TickPlan
from meshbench.scheduler.scheduler import ContinuousBatchScheduler
from meshbench.scheduler.session import GenerationRequest, Session
from meshbench.scheduler.telemetry import SchedulerTelemetry

# on_submit(tick, decision, arrival, now): arrival and now in ticks, or in seconds on the wall clock
OnSubmit = Callable[[int, AdmissionDecision, float, float], None]


@dataclass(frozen=True, slots=True)
class WallClock:
    """Arrivals are seconds after ``start_ns`` on the node's clock; an idle node ``sleep``s until the next."""

    start_ns: int
    sleep: Callable[[float], None] = time.sleep


class NodeDriver:
    def __init__(
        self,
        engine: BatchEngine,
        budget: Budget,
        clock: Callable[[], int] = time.monotonic_ns,
        recover: Callable[[], BatchEngine] | None = None,
        prefill_policy: str = "whole",
    ) -> None:
        self.engine = engine
        self.recover = recover  # the restart policy: a fresh engine after a loss (None: no restart)
        self.clock = clock
        self.sched = ContinuousBatchScheduler(
            EngineFigures.of(engine), budget, clock, prefill_policy, prefix_cache=engine.kv_bytes_shared is not None
        )
        # A tick is one step from the scheduler's plan to its record: submissions and cancellations from
        # other threads wait for it (a session cancelled between plan and answer would be answered twice).
        self._lock = threading.RLock()

    # --- the node's operations ---------------------------------------------------------
    def submit(self, request: GenerationRequest) -> AdmissionDecision:
        with self._lock:
            return self.sched.submit(request)

    def cancel(self, session_id: str) -> CancelResult:
        """End a session CANCELLED and release its KV in the engine now."""
        with self._lock:
            result = self.sched.cancel(session_id)
            self._release(self.sched.take_releases())
            return result

    def run_tick(self) -> Tick:
        """One tick: the scheduler's plan, its one engine call, the answers, the releases, the record."""
        with self._lock:
            plan = self.sched.schedule()
            result, decode_ns, prefill_ns = self._step(plan)
            self._release(self.sched.apply(plan, result, decode_ns, prefill_ns))
            return self.sched.record(plan, self.engine.kv_bytes_in_use, self.engine.kv_bytes_shared)

    def run_to_completion(
        self,
        max_ticks: int | None = None,
        on_tick: Callable[[Tick], None] | None = None,
        arrivals: Sequence[tuple[float, GenerationRequest]] = (),
        on_submit: OnSubmit | None = None,
        before_tick: Callable[[int], None] | None = None,
        wall: WallClock | None = None,
        on_turn: OnSubmit | None = None,
    ) -> list[Tick]:
        """Tick until no session waits, runs or is still to arrive; ``on_tick`` sees every tick's record.

        ``arrivals`` are (time, request) pairs: on the tick clock, the tick counted from this call's first,
        before which the request is submitted (in the given order; a tick with nothing live still runs
        while arrivals remain: the node idles); on the ``wall`` clock, seconds, a request submitted once
        its time has passed (checked before each tick; ticks run only with live sessions). ``on_submit``
        sees each decision; ``before_tick`` sees the tick's number (a fault plan acts there) before it runs. A
        conversation's next turn is submitted as soon as its last one completed, before the next tick
        (``on_turn`` sees each decision).
        Bounded: admission only accepts sessions that fit a slot and a free slot always goes to the queue,
        so every tick with live sessions prefills or decodes at least one token (asserted); the last arrival
        plus the pending tokens bound the ticks. Running past the bound (``max_ticks``, or sessions submitted
        from outside during the run) raises MeshbenchError.
        """
        start = self.sched.tick_count()
        schedule = sorted(((t, i, r) for i, (t, r) in enumerate(arrivals)), key=lambda x: (x[0], x[1]))
        bound = self._bound(schedule, max_ticks, wall)
        k = 0
        while self.sched.has_work() or k < len(schedule):
            tick = self.sched.tick_count() - start
            now = tick if wall is None else (self.clock() - wall.start_ns) / 1e9
            if wall is None:
                self._check_bound(tick, bound)
            while k < len(schedule) and schedule[k][0] <= now:
                decision = self.submit(schedule[k][2])
                if on_submit is not None:
                    on_submit(tick, decision, schedule[k][0], now)
                k += 1
            if wall is not None:
                if not self.sched.has_work():
                    if k < len(schedule):
                        wall.sleep(max(0.0, schedule[k][0] - now))
                    continue
                self._check_bound(tick, bound)
            if before_tick is not None:
                before_tick(tick)
            self._next_turns(self._progressing_tick(on_tick), tick + 1, on_turn)
        return self.sched.ticks()[start:]

    def _next_turns(self, rec: Tick, tick: int, on_turn: OnSubmit | None) -> None:
        """Each conversation that completed a turn in ``rec`` gets its next turn submitted (before ``tick``)."""
        for sid in rec.completed:
            s = self.sched.session(sid)
            later = s.request.next_turn(s.tokens) if s is not None else None
            if later is not None:
                decision = self.submit(later)
                if on_turn is not None:
                    on_turn(tick, decision, tick, tick)

    def _progressing_tick(self, on_tick: Callable[[Tick], None] | None) -> Tick:
        live_before = self.sched.live_count()
        rec = self.run_tick()
        assert (
            not live_before
            or rec.decode_batch
            or rec.prefill_chunks
            or rec.ended
            or self.sched.live_count() < live_before
        ), f"a tick made no progress with {self.sched.live_count()} live sessions (active cap {self.sched.active_cap})"
        if on_tick is not None:
            on_tick(rec)
        return rec

    def _bound(self, schedule: list, max_ticks: int | None, wall: WallClock | None) -> int:
        """Every tick with live sessions writes a prompt position or a token, or ends a session."""
        if max_ticks is not None:
            return max_ticks
        if wall is not None:
            return sum(r.total_tokens + r.later_tokens for _, _, r in schedule) + 1  # (chunked: prefill-only ticks)
        pending = self.sched.pending_tokens() + sum(r.total_tokens + r.later_tokens for _, _, r in schedule)
        return max((t for t, _, _ in schedule), default=0) + pending + 1

    def _check_bound(self, ticks: int, bound: int) -> None:
        if ticks >= bound + self.sched.resubmitted_work:
            raise MeshbenchError(f"scheduler did not finish within {bound} ticks")

    # --- the engine call ---------------------------------------------------------------------
    def _step(self, plan: TickPlan) -> tuple[TickResult | None, int, int]:
        """The plan's one engine call. Returns its TickResult (None: the engine was lost in it) and the time
        the decode and the prefill waited (the call's own overhead counts as the decode's)."""
        if plan.down is not None:  # no engine any more: nothing to prefill on
            why = f"{plan.down} (not restarted)"
            return TickResult([], [failure(c.session.session_id, why, plan.down) for c in plan.chunks]), 0, 0
        if plan.empty:
            return TickResult(), 0, 0
        e0 = self.clock()
        try:
            result = self.engine.step(plan.feed, plan.chunks)
        except EngineLost as exc:
            ns = self.clock() - e0
            self._lost(plan, str(exc))
            return None, ns if plan.decode else 0, 0 if plan.decode else ns
        except Exception as exc:  # a step that raised as a whole: every session in it fails
            result = TickResult(
                [raised(it.session_id, "step", exc) for it in plan.feed],
                [raised(c.session.session_id, "step", exc) for c in plan.chunks],
            )
        ns = self.clock() - e0
        prefill_ns = min(result.prefill_ns, ns) if plan.decode else ns
        return result, ns - prefill_ns, prefill_ns

    def _lost(self, plan: TickPlan, cause: str) -> None:
        """The engine's process is gone: its sessions fail; then a fresh engine and the lost sessions
        resubmitted, or the node stays up without one (the rest fails, it does not hang)."""
        lost = self.sched.engine_lost(plan, cause)
        self._release(self.sched.take_releases())  # their KV went with the process: each release says so
        if self.recover is None:
            self.sched.engine_down(cause)
            return
        try:
            self.engine = self.recover()
        except Exception as e:
            self.sched.engine_down(f"{cause}; restart failed: {e}", restart_error=str(e))
            return
        self.sched.resubmit(lost)

    def _release(self, session_ids: Sequence[str]) -> None:
        for sid in session_ids:
            try:
                self.engine.release(sid)
            except EngineLost:
                pass  # its KV went with the process; the next engine call reports the loss
            except Exception as exc:  # a release fault must not take the node down either
                self.sched.release_failed(exc)

    # --- read-outs ----------------------------------------------------------------------
    def has_work(self) -> bool:
        return self.sched.has_work()

    def sessions(self) -> list[Session]:
        return self.sched.sessions()

    def session(self, session_id: str) -> Session | None:
        return self.sched.session(session_id)

    def ticks(self) -> list[Tick]:
        return self.sched.ticks()

    def running_ids(self) -> list[str]:
        return self.sched.running_ids()

    def losses(self) -> list[EngineLoss]:
        return self.sched.losses()

    def telemetry(self) -> SchedulerTelemetry:
        return self.sched.telemetry(self.engine.kv_bytes_in_use)
