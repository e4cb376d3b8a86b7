"""The schedule replayed from the tick records: each tick's work against the policy and the sessions' own
records, the decode feed, arrivals and admissions, the isolation passes, and every session's end."""

from __future__ import annotations

from meshbench.analysis import backpressure, isolation
from meshbench.analysis.checks import Checks
from meshbench.errors import MeshbenchError
from meshbench.names import RESULTS
from meshbench.records import serial
from meshbench.records.model import LevelRecord
from meshbench.records.turns import turn_numbers
from meshbench.results.typed import NodeBundle
from meshbench.scheduler.budget import ACCEPTED
from meshbench.scheduler.plan import chunks
from meshbench.verify import turns
from meshbench.verify.bursts import burst_ticks
from meshbench.verify.figures import workload_ids
from meshbench.workload import arrivals


def check_tick_replay(c: Checks, b: NodeBundle, lv: LevelRecord, at: str) -> None:
    """Replay the tick records: held positions, active slots and queue depth at the end of every tick.

    Exact for a level where no engine was lost (sessions accepted before a tick join the live
    ones, sessions that ended leave, and a free slot is always taken by the queue, so active =
    min(cap, live)); a level with a lost engine is judged by the fault checks.
    """
    if lv.engine_losses:
        return
    scratch = b.results.engine.scratch_bytes_per_session
    cap = min(lv.budget.max_active_sessions, lv.budget.scratch_bytes // scratch)
    accepted_at: dict[int, int] = {}
    for e in [*lv.submit_events, *(lv.turn_events or ())]:
        if e.decision in ACCEPTED:
            accepted_at[e.tick] = accepted_at.get(e.tick, 0) + 1
    live = 0
    held: dict[str, int] = {}  # running session -> positions it holds
    for t in lv.tick_records:
        live += accepted_at.get(t.tick, 0)
        for sid in t.decode_sessions:
            held[sid] = held.get(sid, 0) + 1
        for sid, start, n in t.prefill_chunks:
            held[sid] = start + n
        for sid in [*t.completed, *t.ended]:
            held.pop(sid, None)
            live -= 1
        where = f"{at}.tick_records[{t.tick}]"
        c.equal(RESULTS, f"{where}.stored_tokens (replayed)", sum(held.values()), t.stored_tokens)
        c.equal(RESULTS, f"{where}.active (replayed)", min(cap, live), t.active)
        c.equal(RESULTS, f"{where}.queued (replayed)", live - min(cap, live), t.queued)


def check_arrivals(c: Checks, b: NodeBundle, lv: LevelRecord, at: str) -> None:
    """Arrival times recomputed from the process and the seed; one submit event per arrival, in arrival
    order (on the tick clock, at its tick); the accepted ones are exactly the level's sessions; the
    admission figures recomputed from the events."""
    w = b.results.workload
    wall = b.cfg.clock == "wall"
    try:
        process = arrivals.parse(lv.arrivals)
        expected_times = (
            [t * 1e3 for t in process.seconds(w.sessions, w.seed)] if wall else process.ticks(w.sessions, w.seed)
        )
    except MeshbenchError as e:
        c.equal(RESULTS, f"{at}.arrivals", "an arrival process", f"{lv.arrivals!r} ({e})")
        return
    c.equal(RESULTS, f"{at}.rate", process.rate, lv.rate)
    c.equal(
        RESULTS,
        f"{at}.arrival_times (recomputed from the process and seed {w.seed})",
        expected_times,
        lv.arrival_times,
    )
    ids = [f"s{i:0{len(str(w.sessions - 1))}d}" for i in range(w.sessions)]
    expected = sorted(zip(expected_times, ids))
    events = lv.submit_events
    if wall:  # submitted before the first tick after arrival: the order is known, the tick is not
        c.equal(
            RESULTS,
            f"{at}.submit_events (arrival, session) in arrival order",
            [list(x) for x in expected],
            [[e.arrival_ms, e.session_id] for e in events],
        )
        c.equal(
            RESULTS,
            f"{at}.submit_events ticks (never decreasing)",
            sorted(e.tick for e in events),
            [e.tick for e in events],
        )
    else:
        c.equal(
            RESULTS,
            f"{at}.submit_events (tick, session) in arrival order",
            [list(x) for x in expected],
            [[e.tick, e.session_id] for e in events],
        )
    _check_admissions(c, b, lv, at, wall)


def _check_admissions(c: Checks, b: NodeBundle, lv: LevelRecord, at: str, wall: bool) -> None:
    """The accepted arrivals (and resubmissions) are exactly the level's sessions; the refusals and the
    backpressure figures recomputed from the submit events."""
    events = lv.submit_events
    accepted = sorted(
        [e.session_id for e in events if e.decision in ACCEPTED]
        + [r.session_id for loss in lv.engine_losses for r in loss.resubmitted if r.decision in ACCEPTED]
        + turns.accepted_turns(lv)
    )
    c.equal(
        RESULTS,
        f"{at}.submit_events epochs (1 when accepted: a sweep never resubmits; none when refused)",
        [1 if e.decision in ACCEPTED else None for e in events],
        [e.epoch for e in events],
    )
    c.equal(
        RESULTS,
        f"{at}.sessions (= the accepted arrivals, resubmissions and later turns)",
        accepted,
        sorted(s.session_id for s in lv.sessions),
    )
    rejected = sum(e.decision not in ACCEPTED for e in events)
    c.equal(RESULTS, f"{at}.rejected_admissions (from the submit events)", rejected, lv.rejected_admissions)
    rep = lv.repetitions[0]
    expected = serial.to_json(
        backpressure.figures(
            events, lv.tick_records, lv.sessions, b.cfg.slo, (rep.sessions, rep.wall_s) if wall else None
        )
    )
    found = serial.to_json(lv.backpressure)
    c.equal(RESULTS, f"{at}.backpressure figures", sorted(expected), sorted(found))
    for k, v in expected.items():
        c.equal(RESULTS, f"{at}.backpressure.{k}", v, found.get(k))


def check_feed(c: Checks, lv: LevelRecord, at: str) -> None:
    """What each tick fed the engine: the decode batch's sessions in order, each at the position after the
    positions it holds, with the last token it generated (replayed from the prompt lengths and tokens).
    Exact where no engine was lost (a resubmitted epoch restarts its count: judged by the fault checks)."""
    if lv.engine_losses:
        return
    current = turns.Current(lv.sessions)
    have: dict[str, int] = {}  # tokens each session has had, replayed
    had: dict[tuple[str, int], int] = {}  # ... by (session, epoch), once it ended
    for t in lv.tick_records:
        where = f"{at}.tick_records[{t.tick}]"
        c.equal(
            RESULTS,
            f"{where}.decode_feed sessions (= decode_sessions)",
            t.decode_sessions,
            [f[0] for f in t.decode_feed],
        )
        for sid, pos, tok in t.decode_feed:
            s = current.get(sid)
            k = have.get(sid, 0)
            if s is None or k == 0:
                c.equal(RESULTS, f"{where}.decode_feed {sid} (a session with a first token)", True, False)
                continue
            c.equal(RESULTS, f"{where}.decode_feed {sid} position", s.prompt_tokens + k - 1, pos)
            c.equal(
                RESULTS,
                f"{where}.decode_feed {sid} token (its token {k - 1})",
                s.tokens[k - 1] if k - 1 < len(s.tokens) else None,
                tok,
            )
        for sid in t.decode_sessions:
            have[sid] = have.get(sid, 0) + 1
        for sid in t.prefill_sessions:
            have[sid] = 1
        for sid in (*t.completed, *t.ended):
            s = current.get(sid)
            if s is not None:
                had[sid, s.epoch] = have.pop(sid, 0)
            current.end(sid)
    for s in lv.sessions:  # (a cache miss or failure in its last decode produced no token)
        if s.done_reason == "COMPLETED":
            c.equal(
                RESULTS,
                f"{at}.sessions {s.session_id} tokens (replayed from the feed)",
                had.get((s.session_id, s.epoch), have.get(s.session_id, 0)),
                len(s.tokens),
            )


def check_tick_ends(c: Checks, b: NodeBundle, lv: LevelRecord, at: str) -> None:
    """Who ended in a tick agrees with how the sessions ended, a session taken from the queue was queued and
    submitted by then and prefilled only after (levels without an engine loss: a resubmission queues unseen
    by the submit events), and prefill pieces stay in budget."""
    budget = lv.budget.max_prefill_tokens_per_tick
    chunked = chunks(b.cfg.prefill)
    at_burst = burst_ticks(b, lv)
    for t in lv.tick_records:
        pieces = [n for _, _, n in t.prefill_chunks]
        # whole prompts: the first always runs (one larger than the budget still progresses), the rest fit;
        # burst: a tick where no session could decode prefills every prompt waiting (meshbench.verify.bursts)
        ok = True if t.tick in at_burst else sum(pieces) <= budget if chunked or len(pieces) > 1 else True
        c.equal(RESULTS, f"{at}.tick_records[{t.tick}].prefill_chunks (within the budget of {budget})", True, ok)
    ended_at = {(s.session_id, s.end_tick): s for s in lv.sessions}
    queued: dict[str, list[int]] = {}  # ticks it was queued at (a conversation: once per turn, at most)
    for e in [*lv.submit_events, *(lv.turn_events or ())]:
        if e.decision == "QUEUED":
            queued.setdefault(e.session_id, []).append(e.tick)
    starts: dict[str, list[int]] = {}  # ticks its prompts' first pieces ran
    for t in lv.tick_records:
        for sid, start, _ in t.prefill_chunks:
            if start == 0:
                starts.setdefault(sid, []).append(t.tick)
    for t in lv.tick_records:
        where = f"{at}.tick_records[{t.tick}]"
        for sid in t.completed:
            s = ended_at.get((sid, t.tick))
            c.equal(
                RESULTS,
                f"{where}.completed {sid} (ended COMPLETED in this tick)",
                ["COMPLETED", t.tick],
                [s and s.done_reason, s and s.end_tick],
            )
        for sid in t.ended:
            s = ended_at.get((sid, t.tick))
            c.equal(
                RESULTS,
                f"{where}.ended {sid} (ended otherwise in this tick)",
                [True, t.tick],
                [s is not None and s.done_reason != "COMPLETED", s and s.end_tick],
            )
        for sid in t.admitted if not lv.engine_losses else ():
            q = max((x for x in queued.get(sid, ()) if x <= t.tick), default=None)
            mine = starts.get(sid, [])
            ok = q is not None and not any(q <= x <= t.tick for x in mine)  # (it may fail before any piece)
            c.equal(RESULTS, f"{where}.admitted {sid} (queued at or before this tick, prefilled after it)", True, ok)


def check_isolation(c: Checks, b: NodeBundle, lv: LevelRecord, at: str) -> None:
    """The perturbation passes are the ones the method prescribes and the verdict is theirs."""
    iso = lv.isolation
    wanted = b.cfg.isolation and b.cfg.clock == "tick" and not lv.faults
    c.equal(
        RESULTS,
        f"{at}.isolation (run exactly when isolation is on, on the tick clock, without faults)",
        wanted,
        iso.passes is not None,
    )
    c.equal(
        RESULTS,
        f"{at}.isolation.sessions (the workload's, when run)",
        None if iso.passes is None else workload_ids(b),
        iso.sessions,
    )
    if iso.passes is not None:
        ids = workload_ids(b)
        served = [s.session_id for s in lv.sessions]
        family = [p.perturbed for p in iso.passes if not p.confirm]
        prescribed = isolation.family_sets(ids, b.cfg.isolation_rounds, iso.groups, b.cfg.isolation_family)
        c.equal(
            RESULTS,
            f"{at}.isolation.passes: how many the {b.cfg.isolation_family} family prescribes "
            f"({len(ids)} sessions, {b.cfg.isolation_rounds} rounds)",
            len(prescribed),
            len(family),
        )
        if len(prescribed) == len(family):
            c.equal(RESULTS, f"{at}.isolation.passes perturbed sets (the separating family)", prescribed, family)
        c.equal(
            RESULTS,
            f"{at}.isolation.groups (the workload's shared prefixes)",
            serial.to_json(isolation.prefix_groups(b.cfg.workload.groups())),
            iso.groups,
        )
        c.equal(
            RESULTS,
            f"{at}.isolation.passes confirmations (each suspect alone, until a victim of it changes)",
            isolation.expected_confirmations(lv),
            [p.perturbed for p in iso.passes if p.confirm],
        )
        _check_pass_sessions(c, lv, at, ids, served)
    verdict = isolation.verdict(lv.isolation, lv.sessions, lv.tick_records)
    c.equal(RESULTS, f"{at}.isolation_verdict", serial.to_json(verdict), serial.to_json(lv.isolation_verdict))


def _check_pass_sessions(c: Checks, lv: LevelRecord, at: str, ids: list[str], served: list[str]) -> None:
    """Each pass served the level's sessions (each turn) in the level's order where its schedule is the level's;
    where it changed, the workload's sessions, each turn once (the verdict names the pass)."""
    iso = lv.isolation
    assert iso.passes is not None
    turns = any(s.epoch > 1 for s in lv.sessions)  # a conversation: each turn is its own record
    epochs = [(s.session_id, s.epoch if turns else None) for s in lv.sessions]
    base = isolation.digest(isolation.schedule_view(lv.tick_records))
    for k, p in enumerate(iso.passes):
        if p.schedule_digest != base:  # another schedule ends sessions in another order: the verdict names it
            pairs = [(s.session_id, s.epoch) for s in p.sessions]
            c.equal(
                RESULTS,
                f"{at}.isolation.passes[{k}].sessions (the workload's, each turn once; its schedule changed)",
                True,
                len(set(pairs)) == len(pairs) and {sid for sid, _ in pairs} <= set(ids),
            )
            continue
        c.equal(
            RESULTS,
            f"{at}.isolation.passes[{k}].sessions (the level's)",
            served,
            [s.session_id for s in p.sessions],
        )
        c.equal(
            RESULTS,
            f"{at}.isolation.passes[{k}].sessions epochs (the level's turns)",
            epochs,
            [(s.session_id, s.epoch) for s in p.sessions],
        )


def check_sessions(c: Checks, b: NodeBundle, levels: list[LevelRecord]) -> None:
    """Every level serves exactly the workload's sessions, each with its own prompt and length."""
    w = b.results.workload
    n = w.sessions
    width = len(str(n - 1))
    expected = {f"s{i:0{width}d}": i for i in range(n)}  # the names Workload.session_ids gives
    ref_ids = None
    for i, lv in enumerate(levels):
        at = f"levels[{i}]"
        ids = [s.session_id for s in lv.sessions]
        ends = [(s.session_id, s.epoch) for s in lv.sessions]
        c.equal(RESULTS, f"{at}.sessions (id, epoch) unique", len(ends), len(set(ends)))
        c.equal(RESULTS, f"{at}.sessions ids not in the workload", [], sorted(set(ids) - set(expected)))
        if ref_ids is None:
            ref_ids = sorted(set(ids))
        elif b.results.reference is None:  # all at once: every level serves the same sessions
            c.equal(RESULTS, f"{at}.sessions ids (same as levels[0])", ref_ids, sorted(set(ids)))
        turn = turn_numbers(lv.sessions)
        for j, s in enumerate(lv.sessions):
            k = expected.get(s.session_id)
            first = turn[s.session_id, s.epoch] == 1 or not lv.turn_events  # (a later turn: meshbench.verify.turns)
            if k is not None and first:
                whole = b.cfg.workload.prompt_tokens[k]  # a shared prefix and its own
                c.equal(RESULTS, f"{at}.sessions[{j}].prompt_tokens", whole, s.prompt_tokens)
                c.equal(RESULTS, f"{at}.sessions[{j}].max_new_tokens", w.new_tokens[k], s.max_new_tokens)
        named = {sid for t in lv.tick_records for sid in (*t.decode_sessions, *t.prefill_sessions, *t.completed)}
        c.equal(RESULTS, f"{at}.tick_records session ids not among the level's sessions", [], sorted(named - set(ids)))
