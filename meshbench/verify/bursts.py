"""A burst tick replayed from the tick records: under ``burst`` or ``chunked-burst``, a tick where no session could
decode prefills every prompt waiting then (the policy's reason to exceed the budget), each to its last piece."""

from __future__ import annotations

from meshbench.analysis.checks import Checks
from meshbench.names import RESULTS
from meshbench.records.model import LevelRecord
from meshbench.results.typed import NodeBundle
from meshbench.scheduler.budget import AdmissionReason
from meshbench.scheduler.plan import bursts


def check_bursts(c: Checks, b: NodeBundle, lv: LevelRecord, at: str) -> None:
    """Every session admitted by a burst tick and not yet through its prompt completes its prompt in that tick, or
    ends in it (a failed piece). Levels with conversations (a later turn is a prompt too) or a lost engine (its
    resubmissions) are left to the other schedule checks."""
    if not bursts(b.cfg.prefill) or lv.turn_events or lv.engine_losses:
        return
    ready: dict[int, set[str]] = {}  # tick -> sessions whose prompt may be prefilled from that tick
    for e in lv.submit_events:
        if e.decision == AdmissionReason.ADMITTED.value:
            ready.setdefault(e.tick, set()).add(e.session_id)
    for t in lv.tick_records:
        for sid in t.admitted:  # (a freed slot taken at the end of the tick: prefilled from the next)
            ready.setdefault(t.tick + 1, set()).add(sid)
    at_burst = burst_ticks(b, lv)
    waiting: set[str] = set()
    for t in lv.tick_records:
        waiting |= ready.get(t.tick, set())
        if t.tick in at_burst and waiting:
            left = sorted(waiting - set(t.prefill_sessions) - set(t.ended))
            c.equal(
                RESULTS,
                f"{at}.tick_records[{t.tick}].prefill_sessions (a burst: every waiting prompt to its end)",
                [],
                left,
            )
        waiting -= {*t.prefill_sessions, *t.completed, *t.ended, *t.resubmitted}


def burst_ticks(b: NodeBundle, lv: LevelRecord) -> set[int]:
    """The ticks where the policy bursts: ``burst`` or ``chunked-burst``, and no session could decode (none had its
    first token and was still running; a tick that left its running sessions out of the decode batch is not one)."""
    if not bursts(b.cfg.prefill):
        return set()
    lost = {loss.tick: [str(sid) for sid, _ in loss.lost] for loss in lv.engine_losses or ()}
    running: set[str] = set()  # sessions with a first token and not ended: each decodes in every tick
    out = set()
    for t in lv.tick_records:
        if t.decode_batch == 0 and not running:
            out.add(t.tick)
        running |= set(t.prefill_sessions)
        running -= {*t.completed, *t.ended, *t.resubmitted, *lost.get(t.tick, ())}
    return out
