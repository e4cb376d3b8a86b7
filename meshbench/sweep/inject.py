"""A fault row acting on one pass: between ticks on the scheduler and the node's processes, and inside
the engine calls through a wrapper engine. After the pass, each fault becomes an event: the tick it
fired, where it hit, and what happened to which session (id, epoch, end).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Sequence

from meshbench.engine.base import DecodeItem, PrefillChunk, TickResult, step_with_faults
from meshbench.engine.process.proxy import ProxyEngine
from meshbench.errors import MeshbenchError
from meshbench.records.model import EngineLoss, FaultEvent, FaultSession, Resubmission
from meshbench.scheduler.session import Session, SessionStatus
from meshbench.workload.faults import Fault, FaultKind

if TYPE_CHECKING:
    from meshbench.sweep.driver import NodeDriver

# At one tick: cancels, evictions, then what fires inside a call, then kills.
ORDER = {
    FaultKind.CANCEL: 0,
    FaultKind.EVICT: 1,
    FaultKind.RAISE: 2,
    FaultKind.ABORT_ENGINE: 2,
    FaultKind.KILL_WORKER: 3,
    FaultKind.KILL_ENGINE: 4,
}


class FaultPlan:
    def __init__(
        self,
        faults: Sequence[Fault],
        kill_engine: Callable[[], None] | None = None,
        kill_worker: Callable[[int], None] | None = None,
    ) -> None:
        self.faults = list(faults)  # the row's order: the events come out in it
        self._order = sorted(range(len(self.faults)), key=lambda i: (self.faults[i].tick, ORDER[self.faults[i].kind]))
        self._kill_engine, self._kill_worker = kill_engine, kill_worker
        self.node: NodeDriver | None = None  # the pass's node, set once it exists
        self.tick = -1
        self._fired: dict[int, dict] = {}  # fault index -> what was known when it fired
        self._pending = [i for i in self._order if self.faults[i].call]  # inside-call faults not yet fired

    def wrap(self, engine):
        return FaultyEngine(engine, self) if self.faults else engine

    def before_tick(self, tick: int) -> None:
        self.tick = tick
        for i in self._order:  # at one tick: cancels, evictions, then kills
            f = self.faults[i]
            if f.tick == tick and f.between_ticks:
                self._fired[i] = {"tick": tick, **self._apply(f)}

    def _apply(self, f: Fault) -> dict:
        node = self.node
        assert node is not None
        if f.kind.on_session:
            assert isinstance(f.target, str)  # (parse: a session's fault names it)
            s = node.session(f.target)
            hit = _state(s)
            if s is None or s.status is SessionStatus.FINISHED:
                return {"hit": hit, "target": None}
            if f.kind is FaultKind.CANCEL:
                node.cancel(f.target)
            elif s.status is SessionStatus.RUNNING:
                node.engine.release(f.target)  # the engine drops it; the scheduler learns at its next decode
            else:
                return {"hit": hit, "target": None}  # no KV yet: nothing to evict
            return {"hit": hit, "target": [s.session_id, s.epoch]}
        resident = len(node.running_ids())
        if f.kind is FaultKind.KILL_ENGINE:
            assert self._kill_engine is not None
            self._kill_engine()
            return {"hit": f"between ticks, {resident} session(s) resident in the engine"}
        assert self._kill_worker is not None and isinstance(f.target, int)
        self._kill_worker(f.target)
        return {"hit": f"between ticks, worker {f.target} killed, {resident} session(s) resident"}

    def take(self, call: str) -> Fault | None:
        """The first fault pending for ``call`` whose tick has come: it fires now."""
        for i in self._pending:
            f = self.faults[i]
            if f.call == call and f.tick <= self.tick:
                self._pending.remove(i)
                self._fired[i] = {"tick": self.tick, "hit": f"inside the {call} call"}
                return f
        return None

    def events(self, concurrency: int, ticks: int) -> list[FaultEvent]:
        """One event per fault, in the row's order; a fault that never fired is the input's error."""
        assert self.node is not None
        sessions = self.node.sessions()
        losses = self.node.losses()
        claimed: set[int] = set()  # the losses a fault has claimed, by index
        out = {}
        for i in self._order:  # in tick order, so each lost engine is claimed by the fault that lost it
            f = self.faults[i]
            fired = self._fired.get(i)
            if fired is None:
                what = f"no {f.call} call ran from tick {f.tick}" if f.call else f"tick {f.tick} is never reached"
                raise MeshbenchError(
                    f"fault {f.label}: at concurrency {concurrency} the pass ran {ticks} ticks: "
                    f"{what} (no session reaches it)"
                )
            ended, cause, resubmitted = _outcome(f, fired, sessions, losses, claimed)
            out[i] = FaultEvent(
                fault=f.label,
                tick=fired["tick"],
                hit=fired["hit"],
                sessions=ended,
                cause=cause,
                resubmitted=resubmitted,
            )
        return [out[i] for i in range(len(self.faults))]


def _state(s: Session | None) -> str:
    if s is None:
        return "not yet submitted"
    if s.status is SessionStatus.FINISHED:
        return f"already ended: {_reason(s)}"
    return {
        SessionStatus.QUEUED: "queued",
        SessionStatus.ADMITTED: "awaiting prefill",
        SessionStatus.RUNNING: f"decoding ({len(s.tokens)} token(s) so far)",
    }[s.status]


Outcome = tuple[list[FaultSession], str | None, list[Resubmission]]


def _outcome(f: Fault, fired: dict, sessions: list[Session], losses: list[EngineLoss], claimed: set[int]) -> Outcome:
    """The sessions the fault ended (id, epoch, done reason, error) and, for a lost engine, the cause and
    the resubmissions."""
    ends = {(s.session_id, s.epoch): s for s in sessions}
    if f.kind.on_session:
        hit = [ends[tuple(fired["target"])]] if fired["target"] else []
        return [_end(s) for s in hit], None, []
    if f.kind is FaultKind.RAISE:
        hit = [s for s in sessions if s.end_tick == fired["tick"] and s.error and "InjectedFault" in s.error]
        return [_end(s) for s in hit], None, []
    at = next((k for k, x in enumerate(losses) if x.tick >= fired["tick"] and k not in claimed), None)
    if at is None:
        return [], None, []
    claimed.add(at)
    loss = losses[at]
    lost = {tuple(x) for x in loss.lost}
    later = [
        s
        for s in sessions
        if (s.session_id, s.epoch) not in lost
        and s.error
        and s.error.startswith(loss.cause)
        and s.end_tick is not None
        and s.end_tick >= loss.tick
    ]  # failed without an engine
    hit = sorted([ends[k] for k in lost] + later, key=lambda s: s.arrival)
    return [_end(s) for s in hit], loss.cause, list(loss.resubmitted)


def _end(s: Session) -> FaultSession:
    reason = _reason(s)
    assert reason is not None, s  # (a fault's sessions have ended)
    return FaultSession(session_id=s.session_id, epoch=s.epoch, done_reason=reason, end_tick=s.end_tick, error=s.error)


class FaultyEngine:
    """The engine a fault plan runs through: an armed ``raise`` raises inside the call (inside the
    child when the engine is isolated), an armed ``abort-engine`` aborts the child."""

    def __init__(self, inner, plan: FaultPlan) -> None:
        self.inner, self.plan = inner, plan

    def __getattr__(self, name):  # the figures and kv_bytes_in_use: the inner engine's
        return getattr(self.inner, name)

    def _arm(self, call: str) -> bool:
        """The fault due in this ``call`` part: True when it must raise here (an engine in the node's
        process); an isolated engine is armed to raise, or abort, inside its process."""
        f = self.plan.take(call)
        if f is None:
            return False
        if f.kind is FaultKind.ABORT_ENGINE:
            self.inner.arm(call, "abort")
        elif isinstance(self.inner, ProxyEngine):
            self.inner.arm(call, "raise")
        else:
            return True
        return False

    def step(self, decode: Sequence[DecodeItem], prefill: Sequence[PrefillChunk]) -> TickResult:
        raise_decode = bool(decode) and self._arm("decode")
        raise_prefill = bool(prefill) and self._arm("prefill")
        return step_with_faults(self.inner, decode, prefill, raise_decode, raise_prefill)

    def release(self, session_id: str) -> None:
        self.inner.release(session_id)

    def close(self) -> None:
        self.inner.close()


def _reason(s: Session) -> str | None:
    """An ended session's DoneReason, by value (None: not ended)."""
    return s.done_reason.value if s.done_reason is not None else None
