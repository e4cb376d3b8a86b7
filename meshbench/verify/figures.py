"""The figures and verdicts of a results.json recomputed from its raw records, two ways for the deterministic ones.

``meshbench.analysis.figures`` is what the sweep used to write the figures: recomputing with it
catches a tampered file. The ``_plain_*`` functions below are a second, independent way
to the deterministic figures (written without figures.py), so a wrong figure function
is caught too, not only a tampered file.
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Any

from meshbench.analysis import backpressure, figures, isolation, verdicts
from meshbench.analysis.checks import Checks
from meshbench.names import RESULTS
from meshbench.records import serial
from meshbench.records.context import GgufEngineInfo
from meshbench.records.model import LevelRecord, Reference, SessionRecord
from meshbench.records.tick import Tick
from meshbench.records.turns import by_turn, turn_numbers
from meshbench.results.typed import NodeBundle
from meshbench.scheduler.budget import ACCEPTED
from meshbench.verify import turns


def check_config_copies(c: Checks, b: NodeBundle) -> None:
    """The top-level workload and budget are copies of the config echo's."""
    c.equal(RESULTS, "workload (= config.workload)", b.cfg.workload.to_dict(), serial.to_json(b.results.workload))
    c.equal(RESULTS, "budget (= config.budget)", b.cfg.budget, b.results.budget)
    cfg = b.cfg
    groups = len(cfg.faults) or len(cfg.rates or ()) or 1  # each fault row or rate runs every level
    c.equal(
        RESULTS,
        "levels (config.levels ascending, once per rate or fault row)",
        sorted(cfg.levels) * groups,
        [lv.concurrency for lv in b.levels],
    )


def check_level_figures(c: Checks, b: NodeBundle, lv: LevelRecord, at: str) -> None:
    ticks = lv.tick_records
    for k, v in figures.summarize_ticks(ticks).items():
        c.equal(RESULTS, f"{at}.{k}", v, getattr(lv, k))
    for k, v in _plain_tick_figures(ticks).items():
        c.equal(RESULTS, f"{at}.{k} (independent recomputation)", v, getattr(lv, k))
    for j, s in enumerate(lv.sessions):
        c.equal(RESULTS, f"{at}.sessions[{j}].digest", figures.token_digest(s.tokens), s.digest)
        c.equal(
            RESULTS,
            f"{at}.sessions[{j}].digest (independent recomputation)",
            hashlib.sha256(",".join(map(str, s.tokens)).encode()).hexdigest(),
            s.digest,
        )


def check_level_accounting(c: Checks, b: NodeBundle, lv: LevelRecord, at: str) -> None:
    """Tokens, KV and session ends add up."""
    sessions, ticks = lv.sessions, lv.tick_records
    prefilled = [sid for t in ticks for sid in t.prefill_sessions]  # a resubmitted session: once per epoch
    c.equal(
        RESULTS,
        f"{at}.prefill_tokens (sum of the prompt pieces written)",
        sum(n for t in ticks for _, _, n in t.prefill_chunks),
        lv.prefill_tokens,
    )
    check_prompt_positions(c, lv, at, sessions)
    c.equal(
        RESULTS,
        f"{at}.sessions tokens (prefills + decode_tokens)",
        len(prefilled) + lv.decode_tokens,
        sum(len(s.tokens) for s in sessions),
    )
    _check_tick_kv(c, b, lv, at)
    _check_session_ends(c, b, lv, at)
    _check_end_counts(c, b, lv, at)


def _check_tick_kv(c: Checks, b: NodeBundle, lv: LevelRecord, at: str) -> None:
    """Every tick's KV is its stored positions' (at most, after an eviction), and nothing is held at the end."""
    per_token, ticks = b.results.engine.kv_bytes_per_token, lv.tick_records
    shared = b.cfg.engine.prefix_cache  # blocks counted once: meshbench.verify.prefix checks the KV of such ticks
    for t in ticks:
        where = f"{at}.tick_records[{t.tick}]"
        if shared:
            pass
        elif lv.cache_misses == 0:  # (a lost engine's KV went with it: exact too)
            c.equal(
                RESULTS,
                f"{where}.kv_bytes (stored_tokens x {per_token})",
                t.stored_tokens * per_token,
                t.kv_bytes,
            )
        else:  # an evicted session holds no KV until the scheduler sees its miss
            c.equal(
                RESULTS,
                f"{where}.kv_bytes <= stored_tokens x {per_token}",
                True,
                t.kv_bytes <= t.stored_tokens * per_token,
            )
        c.equal(RESULTS, f"{where}.decode_batch", len(t.decode_sessions), t.decode_batch)
    if ticks and not shared:
        c.equal(RESULTS, f"{at}.tick_records[-1].kv_bytes (all KV released)", 0, ticks[-1].kv_bytes)


def _check_session_ends(c: Checks, b: NodeBundle, lv: LevelRecord, at: str) -> None:
    """Each session's token count, its end-of-generation tokens under its eos policy, and how it ended."""
    named = figures.fault_named(lv.fault_events)
    eos, eog = (
        b.results.workload.eos,
        set(b.results.engine.eog_tokens if isinstance(b.results.engine, GgufEngineInfo) else ()),
    )
    for j, s in enumerate(lv.sessions):
        where = f"{at}.sessions[{j}]"
        if s.done_reason == "COMPLETED":
            early = eos == "stop" and bool(s.tokens) and s.tokens[-1] in eog
            c.equal(
                RESULTS,
                f"{where}.tokens (count: max_new_tokens, or fewer ending at an end-of-generation token under eos stop)",
                True,
                len(s.tokens) == s.max_new_tokens or (early and len(s.tokens) < s.max_new_tokens),
            )
        if eos == "ban" or eos == "stop":
            inside = [t for t in (s.tokens if eos == "ban" else s.tokens[:-1]) if t in eog]
            c.equal(
                RESULTS,
                f"{where}.tokens end-of-generation tokens (eos {eos}: "
                + ("never" if eos == "ban" else "only as the last")
                + ")",
                [],
                inside,
            )
        if s.done_reason in ("FAILED", "UNFINISHED") and (s.session_id, s.epoch) not in named:
            c.equal(
                RESULTS,
                f"{where}.done_reason (only an injected fault may end a session so)",
                "COMPLETED",
                f"{s.done_reason} ({s.error})",
            )


def _check_end_counts(c: Checks, b: NodeBundle, lv: LevelRecord, at: str) -> None:
    """The level's counts of misses, failures and sessions, from the sessions' own records."""
    sessions, named = lv.sessions, figures.fault_named(lv.fault_events)
    c.equal(RESULTS, f"{at}.cache_misses", sum(s.done_reason == "CACHE_MISS" for s in sessions), lv.cache_misses)
    c.equal(RESULTS, f"{at}.failed", sum(s.done_reason == "FAILED" for s in sessions), lv.failed)
    c.equal(
        RESULTS,
        f"{at}.failed (no session may fail but by an injected fault)",
        sum(s.done_reason == "FAILED" and (s.session_id, s.epoch) in named for s in sessions),
        lv.failed,
    )
    resubmitted = sum(r.decision in ACCEPTED for loss in lv.engine_losses for r in loss.resubmitted)
    c.equal(
        RESULTS,
        f"{at}.sessions (count: accepted arrivals, resubmissions and later turns)",
        b.results.workload.sessions - _refused_arrivals(lv) + resubmitted + len(turns.accepted_turns(lv)),
        len(sessions),
    )


def _refused_arrivals(lv: LevelRecord) -> int:
    return sum(e.decision not in ACCEPTED for e in lv.submit_events)


def check_level_budget(c: Checks, b: NodeBundle, lv: LevelRecord, at: str) -> None:
    """At level c the node allows c active sessions and a batch of c; with every session submitted at once
    the queue holds them all, with arrivals over time it is the configured one."""
    base = b.cfg.budget
    queue = base.max_queue_depth
    if lv.arrivals == "all-at-once":
        queue = max(queue, b.results.workload.sessions)
    expected = dataclasses.replace(
        base,
        max_active_sessions=lv.concurrency,
        max_batch_size=lv.concurrency,
        max_queue_depth=queue,
    )
    c.equal(RESULTS, f"{at}.budget", expected, lv.budget)


def check_sweep(c: Checks, b: NodeBundle, typed: list[LevelRecord], reference: Reference | None) -> None:
    levels = typed
    div = figures.sweep_divergence(typed, reference)
    per_level = [isolation.verdict(lv.isolation, lv.sessions, lv.tick_records) for lv in typed]
    v = verdicts.sweep_verdicts(typed, reference, per_level, b.cfg.isolation_family)
    c.equal(
        RESULTS,
        "corruption_free (isolation at every level where it ran, no failed session)",
        v.corruption_free,
        b.results.corruption_free,
    )
    c.equal(RESULTS, "batch_invariant (no divergence across levels)", div is None, b.results.batch_invariant)
    c.equal(RESULTS, "isolation", v.isolation, b.results.isolation)
    c.equal(
        RESULTS,
        "batch_invariant (independent recomputation)",
        _plain_batch_invariant(levels, reference),
        b.results.batch_invariant,
    )
    found = b.results.first_divergence
    if found is not None and div is not None:  # (its class and logit deviation are the rerun's to check)
        found = dataclasses.replace(found, classification=None, logit_deviation=None)
    c.equal(RESULTS, "first_divergence", div, found)
    c.equal(RESULTS, "reference_concurrency", (reference or levels[0]).concurrency, b.results.reference_concurrency)
    c.equal(
        RESULTS,
        "reference (present exactly for a sweep of arrivals or of faults)",
        any(lv.arrivals != "all-at-once" or lv.faults for lv in levels),
        b.results.reference is not None,
    )
    # The margin is meshbench's constant, not the bundle's to choose.
    c.equal(RESULTS, "saturation_margin", figures.SATURATION_MARGIN, b.results.saturation_margin)
    at_once = [lv for lv in levels if lv.rate is None and not lv.faults]
    if at_once:
        conc = [lv.concurrency for lv in at_once]
        occ = [lv.avg_batch_occupancy for lv in at_once]
        c.equal(
            RESULTS, "saturation_concurrency", figures.saturation_level(conc, occ), b.results.saturation_concurrency
        )
        c.equal(
            RESULTS,
            "saturation_concurrency (independent recomputation)",
            _plain_saturation(at_once),
            b.results.saturation_concurrency,
        )
    else:
        c.equal(
            RESULTS,
            "saturation_concurrency (none for a sweep of rates or faults)",
            None,
            b.results.saturation_concurrency,
        )
    c.equal(
        RESULTS,
        "saturation_rates",
        backpressure.saturation_rates(typed) if b.results.reference else None,
        b.results.saturation_rates,
    )


def workload_ids(b: NodeBundle) -> list[str]:
    n = b.results.workload.sessions
    return [f"s{i:0{len(str(n - 1))}d}" for i in range(n)]


# --- the second way: plain loops over the raw records, nothing from figures.py ----------------
def _plain_tick_figures(ticks: list[Tick]) -> dict[str, Any]:
    count = batch_ticks = batch_members = largest = prompt = generated = peak = 0
    for t in ticks:
        count += 1
        members = len(t.decode_sessions)  # the ids, not the decode_batch field
        if members > 0:
            batch_ticks += 1
            batch_members += members
            largest = max(largest, members)
        prompt += t.prefill_tokens
        generated += t.decode_tokens
        peak = max(peak, t.kv_bytes)
    return {
        "ticks": count,
        "avg_batch_occupancy": batch_members / batch_ticks if batch_ticks else 0.0,
        "max_batch_occupancy": largest,
        "tokens_per_tick": (prompt + generated) / count if count else 0.0,
        "peak_kv_bytes": peak,
        "prefill_tokens": prompt,
        "decode_tokens": generated,
    }


def _plain_batch_invariant(levels: list[LevelRecord], alone: Reference | None) -> bool:
    """Every session's tokens agree with the reference's (the sessions run alone, else the first level's)
    on their common part."""
    reference = {k: s.tokens for k, s in by_turn((alone or levels[0]).sessions).items()}  # each turn its own
    for lv in levels:
        turn = turn_numbers(lv.sessions)
        for s in lv.sessions:
            ref = reference.get((s.session_id, turn[s.session_id, s.epoch]))
            if ref is not None:
                common = min(len(ref), len(s.tokens))
                if ref[:common] != s.tokens[:common]:
                    return False
    return True


def _plain_saturation(levels: list[LevelRecord]) -> int:
    """The first level whose next level raises average occupancy by 5% or less; else the last level."""
    for here, after in zip(levels, levels[1:]):
        if after.avg_batch_occupancy <= here.avg_batch_occupancy * 1.05:
            return here.concurrency
    return levels[-1].concurrency


def check_prompt_positions(c: Checks, lv: LevelRecord, at: str, sessions: list[SessionRecord]) -> None:
    """Every prompt is written piece after piece at the right positions: a piece starts at 0 (a session's
    first, or a resubmitted epoch's) or where the last one ended, stays inside the prompt, and a
    session gets its first token exactly when its prompt is complete."""
    next_pos: dict[str, int] = {}
    current = turns.Current(sessions)
    for t in lv.tick_records:
        where = f"{at}.tick_records[{t.tick}]"
        c.equal(
            RESULTS,
            f"{where}.prefill_tokens (its pieces)",
            sum(n for _, _, n in t.prefill_chunks),
            t.prefill_tokens,
        )
        for sid, start, n in t.prefill_chunks:
            s = current.get(sid)
            prompt = s.prompt_tokens if s is not None else 0
            ok = start in (0, next_pos.get(sid, 0)) and n >= 1 and start + n <= prompt
            c.equal(
                RESULTS,
                f"{where}.prefill_chunks {sid}@{start}+{n} (after {next_pos.get(sid, 0)}, prompt {prompt})",
                True,
                ok,
            )
            next_pos[sid] = start + n
        for sid in t.prefill_sessions:
            s = current.get(sid)
            complete = s.prompt_tokens if s is not None else None
            c.equal(RESULTS, f"{where}.prefill_sessions {sid} (prompt complete)", complete, next_pos.get(sid))
        for sid in (*t.completed, *t.ended):  # a conversation's next turn is this id's next epoch
            current.end(sid)
            next_pos.pop(sid, None)
