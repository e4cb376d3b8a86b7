"""What must hold for every level of a fault sweep, checked from the raw records by verify.

Five named checks, each a category of ``Checks`` fields, so the README's fault matrix shows
per level exactly what verify found:

- ``ends once``: each session ends exactly once per epoch (epochs 1, 2, ... in order), with a
  done reason, and a cause when it FAILED; each fault event names sessions as they ended; each engine
  loss's sessions ended FAILED in its tick, each was resubmitted once under its next epoch (as the tick and
  the fault event say), and a record after one that did not complete is such a resubmission;
- ``KV to zero``: the engine's KV in use equals the positions held by running sessions at every
  tick (a lost engine's KV went with it, a restarted one holds only what it prefilled), and is
  zero at the end; an evicted session's KV may be gone before its miss is seen (at most); with the
  prefix cache, a shared block is counted once, in the store, which outlives the sessions (bounds, and
  the store's bytes at the end);
- ``untouched identical``: every session no fault ended COMPLETED with the reference's tokens (a conversation's
  turns each with that turn's; one the node itself evicted under KV pressure ended CACHE_MISS with a start of
  them);
- ``resubmitted identical``: every session lost with its engine and resubmitted ended (in its
  last epoch) COMPLETED with the reference's tokens, unless a later fault ended it;
- ``accounting``: offered (arrivals + resubmissions) = completed + cancelled + failed + cache
  misses + rejected, and the scheduler's counters equal the raw records.
"""

from __future__ import annotations

from collections import Counter

from meshbench.analysis import figures
from meshbench.analysis.checks import Checks
from meshbench.analysis.figures import Served
from meshbench.errors import MeshbenchError
from meshbench.names import RESULTS
from meshbench.records.model import FaultEvent, FaultSession, JsonObject, LevelRecord, SessionRecord
from meshbench.records.turns import by_turn, turn_numbers
from meshbench.scheduler.budget import ACCEPTED
from meshbench.workload import faults
from meshbench.workload.faults import FaultKind

CHECKS = ("ends once", "KV to zero", "untouched identical", "resubmitted identical", "accounting")
EXPECTED_END = {
    FaultKind.CANCEL: ("CANCELLED",),
    FaultKind.EVICT: ("CACHE_MISS",),
    FaultKind.RAISE: ("FAILED",),
    FaultKind.KILL_ENGINE: ("FAILED",),
    FaultKind.ABORT_ENGINE: ("FAILED",),
    FaultKind.KILL_WORKER: ("FAILED",),
}


def check_level(c: Checks, lv: LevelRecord, at: str, reference: Served, kv_bytes_per_token: int) -> None:
    """Every check of a level that ran faults, against the sessions' ``reference`` (each run alone, else the
    sweep's first level); the accounting for every level."""
    _accounting(c, lv, at)
    _losses(c, lv, at)
    if not lv.faults:
        return
    _ends_once(c, lv, at)
    _kv_to_zero(c, kv_bytes_per_token, lv, at)
    _identical(c, lv, at, reference_tokens(reference))


def verdicts(lv: LevelRecord, reference: Served, kv_bytes_per_token: int) -> dict[str, bool | None]:
    """Per named check: did the level pass it (None: nothing to check), as the README's matrix prints."""
    c = Checks()
    check_level(c, lv, "level", reference, kv_bytes_per_token)
    failed = {f.check for f in c.failures if f.check in CHECKS}
    named, resubmitted = figures.fault_named(lv.fault_events), _resubmitted(lv)
    applies = {
        "untouched identical": any((s.session_id, s.epoch) not in named | resubmitted for s in lv.sessions),
        "resubmitted identical": bool(resubmitted),
    }
    return {name: (name not in failed) if applies.get(name, True) else None for name in CHECKS}


def _resubmitted(lv: LevelRecord) -> set[tuple[str, int | None]]:
    """(session, epoch) of every accepted resubmission (a forged one may lack its epoch: named as it is)."""
    return {(r.session_id, r.epoch) for loss in lv.engine_losses for r in loss.resubmitted if r.decision in ACCEPTED}


def _equal(c: Checks, at: str, check: str, what: str, expected: object, found: object) -> None:
    """One comparison of the named fault ``check`` (a column of the README's matrix)."""
    c.equal(RESULTS, f"{at}.faults[{check}] {what}", expected, found, check=check)


def _ends_once(c: Checks, lv: LevelRecord, at: str) -> None:
    by_id: dict[str, list[int]] = {}
    for s in lv.sessions:
        by_id.setdefault(s.session_id, []).append(s.epoch)
        where = f"{s.session_id}#{s.epoch}"
        _equal(c, at, "ends once", f"{where} ended", True, s.done_reason != "UNFINISHED")
        if s.done_reason == "FAILED":
            _equal(c, at, "ends once", f"{where} has a cause", True, bool(s.error))
    for sid, epochs in sorted(by_id.items()):
        _equal(c, at, "ends once", f"{sid} epochs", list(range(1, len(epochs) + 1)), sorted(epochs))
    _equal(
        c,
        at,
        "ends once",
        "one event per fault, in the row's order",
        lv.faults,
        [e.fault for e in lv.fault_events],
    )
    causes = {loss.cause for loss in lv.engine_losses}
    for e in lv.fault_events:
        kind = _kind(e)
        if kind is None:
            _equal(c, at, "ends once", f"{e.fault} is a fault spec", True, False)
            continue
        if kind.needs_process and e.sessions:  # a process fault's cause is the engine loss it caused
            _equal(c, at, "ends once", f"{e.fault} cause (an engine loss's)", True, e.cause in causes)
        for named in e.sessions:
            _event_end(c, lv, at, e, kind, named)


def _losses(c: Checks, lv: LevelRecord, at: str) -> None:
    """Each engine loss as the records have it: every session it lost ended FAILED in its tick; every lost
    session is resubmitted once (after a restart that worked) under its next epoch, as the tick and the fault
    event that caused the loss say; and a session's record after one that did not complete is such a
    resubmission (a conversation's next turn follows only a completed turn)."""
    by_key = {(s.session_id, s.epoch): s for s in lv.sessions}
    ticks = {t.tick: t for t in lv.tick_records}
    events = [e for e in lv.fault_events if e.cause is not None]
    for loss in lv.engine_losses:
        where = f"engine loss at tick {loss.tick}"
        lost = {str(k[0]): k[1] for k in loss.lost if len(k) == 2}
        for sid, epoch in lost.items():
            s = by_key.get((sid, epoch))
            _equal(c, at, "ends once", f"{where}: {sid}#{epoch} ended FAILED in it", ["FAILED", loss.tick],
                   [s and s.done_reason, s and s.end_tick])  # fmt: skip
        again = [(r.session_id, r.epoch) for r in loss.resubmitted]
        accepted = [(r.session_id, r.epoch) for r in loss.resubmitted if r.decision in ACCEPTED]
        if loss.restart_error is None and again:  # (no restart, or a failed one: nothing resubmitted)
            want = [(sid, e + 1 if (sid, e + 1) in accepted else None) for sid, e in lost.items()]
            found = [(sid, e if (sid, e) in accepted else None) for sid, e in again]
            _equal(c, at, "ends once", f"{where}: resubmitted (each lost session once, accepted under its next "
                   "epoch, refused under none)", sorted(want), sorted(found))  # fmt: skip
        t = ticks.get(loss.tick)
        _equal(c, at, "ends once", f"{where}: tick_records[{loss.tick}].resubmitted (the accepted ones)",
               [sid for sid, _ in accepted], t.resubmitted if t is not None else None)  # fmt: skip
        e = next((e for e in events if e.tick <= loss.tick and e.cause == loss.cause), None)
        if e is not None:
            events.remove(e)
            _equal(c, at, "ends once", f"{e.fault} resubmitted (its engine loss's)", again,
                   [(r.session_id, r.epoch) for r in e.resubmitted])  # fmt: skip
    resubmitted = _resubmitted(lv)
    for s in lv.sessions:
        before = by_key.get((s.session_id, s.epoch - 1))
        if before is not None and before.done_reason != "COMPLETED":
            _equal(c, at, "ends once", f"{s.session_id}#{s.epoch} (after one that did not complete) resubmitted",
                   True, (s.session_id, s.epoch) in resubmitted)  # fmt: skip


def _kind(event: FaultEvent) -> FaultKind | None:
    """The recorded fault's kind, read by the spec parser (None: not a fault spec)."""
    try:
        return faults.parse(event.fault, "fault_events").kind
    except MeshbenchError:
        return None


def _event_end(c: Checks, lv: LevelRecord, at: str, e: FaultEvent, kind: FaultKind, named: FaultSession) -> None:
    """A session a fault event names: it ended after the fault fired, at a tick that records it, as the
    session's own record says, and as the fault's kind must end it."""
    end = named.end_tick
    if end is not None:
        _equal(
            c,
            at,
            "ends once",
            f"{e.fault} fired (tick {e.tick}) before {named.session_id} ended (tick {end})",
            True,
            e.tick is not None and e.tick <= end,
        )
        t = next((t for t in lv.tick_records if t.tick == end), None)
        _equal(
            c,
            at,
            "ends once",
            f"{e.fault}: tick {end} records {named.session_id} ending",
            True,
            t is not None and named.session_id in (*t.ended, *t.completed),
        )
    s = next((s for s in lv.sessions if (s.session_id, s.epoch) == (named.session_id, named.epoch)), None)
    found = None if s is None else _end(s)
    _equal(
        c,
        at,
        "ends once",
        f"{e.fault} names {named.session_id}#{named.epoch}",
        _end(named),
        found,
    )
    ends = EXPECTED_END.get(kind, ())
    if kind is FaultKind.EVICT and _raised_too(lv, e, named):  # (the raised decode it was in failed it first)
        ends = (*ends, "FAILED")
    _equal(c, at, "ends once", f"{e.fault} ended it as", True, named.done_reason in ends)


def _raised_too(lv: LevelRecord, e: FaultEvent, named: FaultSession) -> bool:
    """Does a raise fault of the same tick name the session an evict names (both hit it in one tick)?"""
    return any(
        other.tick == e.tick
        and _kind(other) is FaultKind.RAISE
        and any((x.session_id, x.epoch) == (named.session_id, named.epoch) for x in other.sessions)
        for other in lv.fault_events
    )


def _end(s: SessionRecord | FaultSession) -> JsonObject:
    """How a session ended, as a fault event names it."""
    return {"done_reason": s.done_reason, "end_tick": s.end_tick, "error": s.error}


def _kv_to_zero(c: Checks, per_token: int, lv: LevelRecord, at: str) -> None:
    """Without the prefix cache, the KV in use is the running sessions' positions, and zero at the end. With it,
    a shared block is counted once, in the store (kv_bytes_shared), whose unreferenced blocks outlive every
    session: the KV in use is at least the store's and at most the sessions' positions plus the store's, and at
    the end only the store's (verify's prefix replay holds it exactly where no session missed)."""
    # an evict fault, or the node's own eviction under KV pressure: the KV may be gone before the miss is seen
    evicted = any(_kind(e) is FaultKind.EVICT and e.sessions for e in lv.fault_events) or any(
        s.done_reason == "CACHE_MISS" for s in lv.sessions
    )
    for t in lv.tick_records:
        held = t.stored_tokens * per_token
        if t.kv_bytes_shared is not None:
            ok, what = t.kv_bytes_shared <= t.kv_bytes <= held + t.kv_bytes_shared, "and kv_bytes_shared"
        else:
            ok, what = (t.kv_bytes <= held if evicted else t.kv_bytes == held), ""
        _equal(c, at, "KV to zero", f"tick {t.tick} kv_bytes vs stored_tokens x {per_token} {what}".strip(), True, ok)
    last = lv.tick_records[-1] if lv.tick_records else None
    if last is not None and last.kv_bytes_shared is not None:
        _equal(c, at, "KV to zero", "kv_bytes at the end (only the prefix cache's blocks)", last.kv_bytes_shared,
               last.kv_bytes)  # fmt: skip
    else:
        _equal(c, at, "KV to zero", "kv_bytes at the end", 0, last.kv_bytes if last is not None else 0)


def reference_tokens(reference: Served) -> dict[tuple[str, int], list[int]]:
    """The reference's tokens by (session, turn): a conversation's turns each its own reference; a session's one
    request is turn 1, in every epoch (a session resubmitted after an engine loss runs it again)."""
    return {k: s.tokens for k, s in by_turn(reference.sessions).items()}


def _identical(c: Checks, lv: LevelRecord, at: str, reference: dict[tuple[str, int], list[int]]) -> None:
    named, resubmitted = figures.fault_named(lv.fault_events), _resubmitted(lv)
    turn = turn_numbers(lv.sessions)
    for s in lv.sessions:
        key = (s.session_id, s.epoch)
        if key in named:
            continue
        check = "resubmitted identical" if key in resubmitted else "untouched identical"
        where = f"{s.session_id}#{s.epoch}"
        expected = reference.get((s.session_id, turn[s.session_id, s.epoch]))  # none where the reference lacks it
        if s.done_reason == "CACHE_MISS":  # the node's own eviction under KV pressure: the tokens it had made
            _equal(c, at, check, f"{where} tokens (evicted by the node) begin the reference's", True,
                   expected is not None and s.tokens == expected[: len(s.tokens)])  # fmt: skip
            continue
        _equal(c, at, check, f"{where} done_reason", "COMPLETED", s.done_reason)
        _equal(c, at, check, f"{where} tokens = the reference's", True, s.tokens == expected)
    for again in sorted(resubmitted, key=lambda k: (k[0], k[1] or 0)):  # each ran: its session is in the records
        _equal(
            c,
            at,
            "resubmitted identical",
            f"{again[0]}#{again[1]} recorded",
            True,
            any((s.session_id, s.epoch) == again for s in lv.sessions),
        )


def _accounting(c: Checks, lv: LevelRecord, at: str) -> None:
    ends = Counter(s.done_reason for s in lv.sessions)
    resubmissions = [r for loss in lv.engine_losses for r in loss.resubmitted]
    turns = lv.turn_events or []  # a conversation's later turns, offered like arrivals
    refused = sum(e.decision not in ACCEPTED for e in [*lv.submit_events, *turns]) + sum(
        r.decision not in ACCEPTED for r in resubmissions
    )
    raw = {
        "completed": ends["COMPLETED"],
        "cancelled": ends["CANCELLED"],
        "failed": ends["FAILED"],
        "cache_misses": ends["CACHE_MISS"],
        "rejected_admissions": refused,
        "engine_losses": len(lv.engine_losses),
        "resubmitted": len(resubmissions),
    }
    for k, v in raw.items():
        _equal(c, at, "accounting", f"counts.{k} (the scheduler's) = the records'", v, lv.counts[k])
    for loss in lv.engine_losses:  # a restart that failed left no engine to resubmit to
        again = [r.session_id for r in loss.resubmitted] if loss.restart_error is not None else []
        _equal(c, at, "accounting", f"engine loss at tick {loss.tick}: a failed restart resubmitted nothing", [], again)
    offered = len(lv.submit_events) + len(resubmissions) + len(turns)
    closed = raw["completed"] + raw["cancelled"] + raw["failed"] + raw["cache_misses"] + refused
    _equal(c, at, "accounting", "offered (arrivals + resubmissions) = every end + every refusal", offered, closed)
