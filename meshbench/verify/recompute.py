"""Every figure of a results.json recomputed from its raw records, two ways for the deterministic ones.

``meshbench.analysis.figures`` is what the sweep used to write the figures: recomputing with it
catches a tampered file. The ``_plain_*`` functions below are a second, independent way
to the deterministic figures (written without figures.py), so a wrong figure function
is caught too, not only a tampered file.
"""

from __future__ import annotations

import hashlib
import json
import re

from meshbench.analysis import backpressure, figures, isolation, verdicts
from meshbench.analysis import fault_matrix as fault_checks
from meshbench.analysis.checks import Checks
from meshbench.errors import MeshbenchError
from meshbench.names import RESULTS
from meshbench.scheduler.budget import ACCEPTED
from meshbench.workload import arrivals


def check_data(c: Checks, data: dict) -> None:
    check_config_copies(c, data)
    for i, lv in enumerate(data["levels"]):
        at = f"levels[{i}]"
        check_level_figures(c, data, lv, at)
        check_level_accounting(c, data, lv, at)
        check_level_budget(c, data, lv, at)
        check_tick_replay(c, data, lv, at)
        check_arrivals(c, data, lv, at)
        check_repetitions(c, data, lv, at, i)
        check_wall(c, lv, at)
        check_feed(c, lv, at)
        check_isolation(c, data, lv, at)
        check_timing(c, data, lv, at)
        check_tick_ends(c, data, lv, at)
        fault_checks.check_level(c, data, lv, at)
    check_sessions(c, data)
    check_sweep(c, data)


def check_config_copies(c: Checks, data: dict) -> None:
    """The top-level workload and budget are copies of the config echo's."""
    c.equal(RESULTS, "workload (= config.workload)", data["config"]["workload"], data["workload"])
    c.equal(RESULTS, "budget (= config.budget)", data["config"]["budget"], data["budget"])


def check_level_figures(c: Checks, data: dict, lv: dict, at: str) -> None:
    ticks = lv["tick_records"]
    for k, v in figures.summarize_ticks(ticks).items():
        c.equal(RESULTS, f"{at}.{k}", v, lv[k])
    for k, v in _plain_tick_figures(ticks).items():
        c.equal(RESULTS, f"{at}.{k} (independent recomputation)", v, lv[k])
    for j, s in enumerate(lv["sessions"]):
        c.equal(RESULTS, f"{at}.sessions[{j}].digest", figures.token_digest(s["tokens"]), s["digest"])
        c.equal(RESULTS, f"{at}.sessions[{j}].digest (independent recomputation)",
                hashlib.sha256(",".join(map(str, s["tokens"])).encode()).hexdigest(), s["digest"])


def check_level_accounting(c: Checks, data: dict, lv: dict, at: str) -> None:
    """Tokens, KV and session ends add up."""
    per_token = data["engine"]["kv_bytes_per_token"]
    sessions, ticks = lv["sessions"], lv["tick_records"]
    prefilled = [sid for t in ticks for sid in t["prefill_sessions"]]  # a resubmitted session: once per epoch
    by_id = {s["session_id"]: s for s in sessions}
    c.equal(RESULTS, f"{at}.prefill_tokens (sum of the prompt pieces written)",
            sum(n for t in ticks for _, _, n in t["prefill_chunks"]), lv["prefill_tokens"])
    check_prompt_positions(c, lv, at, by_id)
    c.equal(RESULTS, f"{at}.sessions tokens (prefills + decode_tokens)",
            len(prefilled) + lv["decode_tokens"], sum(len(s["tokens"]) for s in sessions))
    for t in ticks:
        where = f"{at}.tick_records[{t['tick']}]"
        if lv["cache_misses"] == 0:  # (a lost engine's KV went with it: exact too)
            c.equal(RESULTS, f"{where}.kv_bytes (stored_tokens x {per_token})", t["stored_tokens"] * per_token,
                    t["kv_bytes"])
        else:  # an evicted session holds no KV until the scheduler sees its miss
            c.equal(RESULTS, f"{where}.kv_bytes <= stored_tokens x {per_token}", True,
                    t["kv_bytes"] <= t["stored_tokens"] * per_token)
        c.equal(RESULTS, f"{where}.decode_batch", len(t["decode_sessions"]), t["decode_batch"])
    if ticks:
        c.equal(RESULTS, f"{at}.tick_records[-1].kv_bytes (all KV released)", 0, ticks[-1]["kv_bytes"])
    named = figures.fault_named(lv)
    eos, eog = data["workload"]["eos"], set(data["engine"].get("eog_tokens", []))
    for j, s in enumerate(sessions):
        where = f"{at}.sessions[{j}]"
        if s["done_reason"] == "COMPLETED":
            early = eos == "stop" and bool(s["tokens"]) and s["tokens"][-1] in eog
            c.equal(RESULTS, f"{where}.tokens (count: max_new_tokens, or fewer ending at an end-of-generation "
                             "token under eos stop)", True,
                    len(s["tokens"]) == s["max_new_tokens"] or (early and len(s["tokens"]) < s["max_new_tokens"]))
        if eos == "ban" or eos == "stop":
            inside = [t for t in (s["tokens"] if eos == "ban" else s["tokens"][:-1]) if t in eog]
            c.equal(RESULTS, f"{where}.tokens end-of-generation tokens (eos {eos}: "
                             + ("never" if eos == "ban" else "only as the last") + ")", [], inside)
        if s["done_reason"] in ("FAILED", "UNFINISHED") and (s["session_id"], s["epoch"]) not in named:
            c.equal(RESULTS, f"{where}.done_reason (only an injected fault may end a session so)", "COMPLETED",
                    f"{s['done_reason']} ({s['error']})")
    c.equal(RESULTS, f"{at}.cache_misses", sum(s["done_reason"] == "CACHE_MISS" for s in sessions),
            lv["cache_misses"])
    c.equal(RESULTS, f"{at}.failed", sum(s["done_reason"] == "FAILED" for s in sessions), lv["failed"])
    c.equal(RESULTS, f"{at}.failed (no session may fail but by an injected fault)",
            sum(s["done_reason"] == "FAILED" and (s["session_id"], s["epoch"]) in named for s in sessions),
            lv["failed"])
    resubmitted = sum(r["decision"] in ACCEPTED for loss in lv["engine_losses"]
                      for r in loss["resubmitted"])
    c.equal(RESULTS, f"{at}.sessions (count: accepted arrivals and resubmissions)",
            data["workload"]["sessions"] - _refused_arrivals(lv) + resubmitted, len(sessions))


def check_prompt_positions(c: Checks, lv: dict, at: str, by_id: dict) -> None:
    """Every prompt is written piece after piece at the right positions: a piece starts at 0 (a session's
    first, or a resubmitted epoch's) or where the last one ended, stays inside the prompt, and a
    session gets its first token exactly when its prompt is complete."""
    next_pos: dict[str, int] = {}
    for t in lv["tick_records"]:
        where = f"{at}.tick_records[{t['tick']}]"
        c.equal(RESULTS, f"{where}.prefill_tokens (its pieces)", sum(n for _, _, n in t["prefill_chunks"]),
                t["prefill_tokens"])
        for sid, start, n in t["prefill_chunks"]:
            prompt = by_id[sid]["prompt_tokens"] if sid in by_id else 0
            ok = start in (0, next_pos.get(sid, 0)) and n >= 1 and start + n <= prompt
            c.equal(RESULTS, f"{where}.prefill_chunks {sid}@{start}+{n} (after {next_pos.get(sid, 0)}, prompt "
                             f"{prompt})", True, ok)
            next_pos[sid] = start + n
        for sid in t["prefill_sessions"]:
            prompt = by_id[sid]["prompt_tokens"] if sid in by_id else None
            c.equal(RESULTS, f"{where}.prefill_sessions {sid} (prompt complete)", prompt, next_pos.get(sid))


def _refused_arrivals(lv: dict) -> int:
    return sum(e["decision"] not in ACCEPTED for e in lv["submit_events"])


def check_level_budget(c: Checks, data: dict, lv: dict, at: str) -> None:
    """At level c the node allows c active sessions and a batch of c; with every session submitted at once
    the queue holds them all, with arrivals over time it is the configured one."""
    base = data["config"]["budget"]
    queue = base["max_queue_depth"]
    if lv["arrivals"] == "all-at-once":
        queue = max(queue, data["workload"]["sessions"])
    expected = dict(base, max_active_sessions=lv["concurrency"], max_batch_size=lv["concurrency"],
                    max_queue_depth=queue)
    c.equal(RESULTS, f"{at}.budget", expected, lv["budget"])


def check_tick_replay(c: Checks, data: dict, lv: dict, at: str) -> None:
    """Replay the tick records: held positions, active slots and queue depth at the end of every tick.

    Exact for a level where no engine was lost (sessions accepted before a tick join the live
    ones, sessions that ended leave, and a free slot is always taken by the queue, so active =
    min(cap, live)); a level with a lost engine is judged by the fault checks.
    """
    if lv["engine_losses"]:
        return
    scratch = data["engine"]["scratch_bytes_per_session"]
    cap = min(lv["budget"]["max_active_sessions"], lv["budget"]["scratch_bytes"] // scratch)
    accepted_at = {}
    for e in lv["submit_events"]:
        if e["decision"] in ACCEPTED:
            accepted_at[e["tick"]] = accepted_at.get(e["tick"], 0) + 1
    live = 0
    held: dict[str, int] = {}  # running session -> positions it holds
    for t in lv["tick_records"]:
        live += accepted_at.get(t["tick"], 0)
        for sid in t["decode_sessions"]:
            held[sid] = held.get(sid, 0) + 1
        for sid, start, n in t["prefill_chunks"]:
            held[sid] = start + n
        for sid in [*t["completed"], *t["ended"]]:
            held.pop(sid, None)
            live -= 1
        where = f"{at}.tick_records[{t['tick']}]"
        c.equal(RESULTS, f"{where}.stored_tokens (replayed)", sum(held.values()), t["stored_tokens"])
        c.equal(RESULTS, f"{where}.active (replayed)", min(cap, live), t["active"])
        c.equal(RESULTS, f"{where}.queued (replayed)", live - min(cap, live), t["queued"])


def check_arrivals(c: Checks, data: dict, lv: dict, at: str) -> None:
    """Arrival times recomputed from the process and the seed; one submit event per arrival, in arrival
    order (on the tick clock, at its tick); the accepted ones are exactly the level's sessions; the
    admission figures recomputed from the events."""
    w = data["workload"]
    wall = data["config"]["clock"] == "wall"
    try:
        process = arrivals.parse(lv["arrivals"])
        expected_times = ([t * 1e3 for t in process.seconds(w["sessions"], w["seed"])] if wall
                          else process.ticks(w["sessions"], w["seed"]))
    except MeshbenchError as e:
        c.equal(RESULTS, f"{at}.arrivals", "an arrival process", f"{lv['arrivals']!r} ({e})")
        return
    c.equal(RESULTS, f"{at}.rate", process.rate, lv["rate"])
    c.equal(RESULTS, f"{at}.arrival_times (recomputed from the process and seed {w['seed']})", expected_times,
            lv["arrival_times"])
    ids = [f"s{i:0{len(str(w['sessions'] - 1))}d}" for i in range(w["sessions"])]
    expected = sorted(zip(expected_times, ids))
    events = lv["submit_events"]
    if wall:  # submitted before the first tick after arrival: the order is known, the tick is not
        c.equal(RESULTS, f"{at}.submit_events (arrival, session) in arrival order", [list(x) for x in expected],
                [[e.get("arrival_ms"), e["session_id"]] for e in events])
        c.equal(RESULTS, f"{at}.submit_events ticks (never decreasing)", sorted(e["tick"] for e in events),
                [e["tick"] for e in events])
    else:
        c.equal(RESULTS, f"{at}.submit_events (tick, session) in arrival order", [list(x) for x in expected],
                [[e["tick"], e["session_id"]] for e in events])
    accepted = sorted([e["session_id"] for e in events if e["decision"] in ACCEPTED]
                      + [r["session_id"] for loss in lv["engine_losses"] for r in loss["resubmitted"]
                         if r["decision"] in ACCEPTED])
    c.equal(RESULTS, f"{at}.submit_events epochs (1 when accepted: a sweep never resubmits; none when refused)",
            [1 if e["decision"] in ACCEPTED else None for e in events], [e["epoch"] for e in events])
    c.equal(RESULTS, f"{at}.sessions (= the accepted arrivals and resubmissions)", accepted,
            sorted(s["session_id"] for s in lv["sessions"]))
    rejected = sum(e["decision"] not in ACCEPTED for e in events)
    c.equal(RESULTS, f"{at}.rejected_admissions (from the submit events)", rejected, lv["rejected_admissions"])
    expected_figures = backpressure.level_figures(lv, {} if wall else data["config"]["slo"])
    if wall:
        rep = lv["repetitions"][0]
        expected_figures.update(backpressure.wall_figures(lv, rep["sessions"], rep["wall_s"], data["config"]["slo"]))
    c.equal(RESULTS, f"{at}.backpressure figures", sorted(expected_figures), sorted(lv["backpressure"]))
    for k, v in expected_figures.items():
        c.equal(RESULTS, f"{at}.backpressure.{k}", v, lv["backpressure"].get(k))


def check_repetitions(c: Checks, data: dict, lv: dict, at: str, index: int) -> None:
    """Every repetition ran the same deterministic pass: same ticks, same sessions, same tokens."""
    reps = lv["repetitions"]
    repeat = data["config"]["repeat"]
    c.equal(RESULTS, f"{at}.repetitions (count = config.repeat)", repeat, len(reps))
    count = len(data["levels"])
    for i, rep in enumerate(reps):
        where = f"{at}.repetitions[{i}]"
        c.equal(RESULTS, f"{where}.repetition", i, rep["repetition"])
        rotated = list(range(i % count, count)) + list(range(i % count))
        c.equal(RESULTS, f"{where}.position (level order rotated by the repetition)", rotated.index(index),
                rep["position"])
        if data["config"]["clock"] == "wall":
            continue  # admission depends on speed: repetitions differ by design, tokens are checked by the sweep
        c.equal(RESULTS, f"{where}.tick_records (deterministic fields = repetition 0's)", True,
                figures.deterministic_ticks(rep["tick_records"]) == lv["tick_records"])
        ends = [(s["session_id"], s["epoch"], s["digest"], s["done_reason"]) for s in rep["sessions"]]
        c.equal(RESULTS, f"{where}.sessions (ids, epochs, digests, ends = repetition 0's)",
                [(s["session_id"], s["epoch"], s["digest"], s["done_reason"]) for s in lv["sessions"]], ends)


def check_wall(c: Checks, lv: dict, at: str) -> None:
    """Every repetition's wall-clock figures from its nanosecond stamps, and their summary."""
    for i, rep in enumerate(lv["repetitions"]):
        for k, v in figures.wall_figures(rep["sessions"], rep["tick_records"], rep["wall_s"]).items():
            c.equal(RESULTS, f"{at}.repetitions[{i}].wall.{k}", v, rep["wall"][k])
    summary = figures.repetition_summary([rep["wall"] for rep in lv["repetitions"]])
    c.equal(RESULTS, f"{at}.wall (summary) figures", sorted(summary), sorted(lv["wall"]))
    for k, v in summary.items():
        if k in lv["wall"]:
            c.equal(RESULTS, f"{at}.wall.{k}", v, lv["wall"][k])


def check_sessions(c: Checks, data: dict) -> None:
    """Every level serves exactly the workload's sessions, each with its own prompt and length."""
    w = data["workload"]
    n = w["sessions"]
    width = len(str(n - 1))
    expected = {f"s{i:0{width}d}": i for i in range(n)}  # the names Workload.session_ids gives
    ref_ids = None
    for i, lv in enumerate(data["levels"]):
        at = f"levels[{i}]"
        ids = [s["session_id"] for s in lv["sessions"]]
        ends = [(s["session_id"], s["epoch"]) for s in lv["sessions"]]
        c.equal(RESULTS, f"{at}.sessions (id, epoch) unique", len(ends), len(set(ends)))
        c.equal(RESULTS, f"{at}.sessions ids not in the workload", [], sorted(set(ids) - set(expected)))
        if ref_ids is None:
            ref_ids = sorted(set(ids))
        elif data["reference"] is None:  # all at once: every level serves the same sessions
            c.equal(RESULTS, f"{at}.sessions ids (same as levels[0])", ref_ids, sorted(set(ids)))
        for j, s in enumerate(lv["sessions"]):
            k = expected.get(s["session_id"])
            if k is not None:
                c.equal(RESULTS, f"{at}.sessions[{j}].prompt_tokens", w["prompt_tokens"][k], s["prompt_tokens"])
                c.equal(RESULTS, f"{at}.sessions[{j}].max_new_tokens", w["new_tokens"][k], s["max_new_tokens"])
        named = {sid for t in lv["tick_records"]
                 for sid in (*t["decode_sessions"], *t["prefill_sessions"], *t["completed"])}
        c.equal(RESULTS, f"{at}.tick_records session ids not among the level's sessions", [],
                sorted(named - set(ids)))


def check_feed(c: Checks, lv: dict, at: str) -> None:
    """What each tick fed the engine: the decode batch's sessions in order, each at the position after the
    positions it holds, with the last token it generated (replayed from the prompt lengths and tokens).
    Exact where no engine was lost (a resubmitted epoch restarts its count: judged by the fault checks)."""
    if lv["engine_losses"]:
        return
    by_id = {s["session_id"]: s for s in lv["sessions"]}
    have: dict[str, int] = {}  # tokens each session has had, replayed
    for t in lv["tick_records"]:
        where = f"{at}.tick_records[{t['tick']}]"
        c.equal(RESULTS, f"{where}.decode_feed sessions (= decode_sessions)", t["decode_sessions"],
                [f[0] for f in t["decode_feed"]])
        for sid, pos, tok in t["decode_feed"]:
            s = by_id.get(sid)
            k = have.get(sid, 0)
            if s is None or k == 0:
                c.equal(RESULTS, f"{where}.decode_feed {sid} (a session with a first token)", True, False)
                continue
            c.equal(RESULTS, f"{where}.decode_feed {sid} position", s["prompt_tokens"] + k - 1, pos)
            c.equal(RESULTS, f"{where}.decode_feed {sid} token (its token {k - 1})",
                    s["tokens"][k - 1] if k - 1 < len(s["tokens"]) else None, tok)
        for sid in t["decode_sessions"]:
            have[sid] = have.get(sid, 0) + 1
        for sid in t["prefill_sessions"]:
            have[sid] = 1
    for s in lv["sessions"]:  # (a cache miss or failure in its last decode produced no token)
        if s["done_reason"] == "COMPLETED":
            c.equal(RESULTS, f"{at}.sessions {s['session_id']} tokens (replayed from the feed)",
                    have.get(s["session_id"], 0), len(s["tokens"]))


def check_isolation(c: Checks, data: dict, lv: dict, at: str) -> None:
    """The perturbation passes are the ones the method prescribes and the verdict is theirs."""
    iso = lv["isolation"]
    wanted = data["config"]["isolation"] and data["config"]["clock"] == "tick" and not lv["faults"]
    c.equal(RESULTS, f"{at}.isolation (run exactly when isolation is on, on the tick clock, without faults)",
            wanted, iso["passes"] is not None)
    c.equal(RESULTS, f"{at}.isolation.sessions (the workload's, when run)",
            None if iso["passes"] is None else _workload_ids(data), iso["sessions"])
    if iso["passes"] is not None:
        ids = _workload_ids(data)
        served = [s["session_id"] for s in lv["sessions"]]
        family = [p["perturbed"] for p in iso["passes"] if not p["confirm"]]
        c.equal(RESULTS, f"{at}.isolation.passes perturbed sets (the separating family)",
                isolation.perturbed_sets(ids), family)
        c.equal(RESULTS, f"{at}.isolation.passes confirmations (one suspect each)", [],
                [p["perturbed"] for p in iso["passes"] if p["confirm"] and len(p["perturbed"]) != 1])
        for k, p in enumerate(iso["passes"]):
            c.equal(RESULTS, f"{at}.isolation.passes[{k}].sessions (the level's)", served,
                    [s["session_id"] for s in p["sessions"]])
    c.equal(RESULTS, f"{at}.isolation_verdict", isolation.verdict(lv), lv["isolation_verdict"])


def check_timing(c: Checks, data: dict, lv: dict, at: str) -> None:
    """Timing that cannot happen, checked on every repetition: stamps out of order, a stamp per token missing
    or extra, a first token before the submit or the slot, engine time beyond its tick, a wall time shorter
    than what it covers, repetitions copied from one another."""
    tokens = {(s["session_id"], s["epoch"], s["digest"]): len(s["tokens"]) for s in lv["sessions"]}
    for i, rep in enumerate(lv["repetitions"]):
        where = f"{at}.repetitions[{i}]"
        last = 0
        for s in rep["sessions"]:
            stamps, who = s["token_ns"], f"{where}.sessions {s['session_id']}#{s['epoch']}"
            count = tokens.get((s["session_id"], s["epoch"], s["digest"]))
            if count is not None:
                c.equal(RESULTS, f"{who}.token_ns (one stamp per token)", count, len(stamps))
            c.equal(RESULTS, f"{who}.token_ns (never decreasing)", True,
                    all(a <= b for a, b in zip(stamps, stamps[1:])))
            c.equal(RESULTS, f"{who} (0 <= submit <= admit <= first token)", True,
                    _ordered([0, s["submit_ns"], s["admit_ns"], stamps[0] if stamps else None]))
            last = max([last, s["submit_ns"], *(stamps[-1:] or [0])])
        ticks = rep["tick_records"]
        bad = [t["tick"] for t in ticks if not 0 <= t["decode_ns"] + t["prefill_ns"] <= t["tick_ns"]
               or min(t["decode_ns"], t["prefill_ns"]) < 0]
        c.equal(RESULTS, f"{where}.tick_records (0 <= decode_ns + prefill_ns <= tick_ns)", [], bad)
        c.equal(RESULTS, f"{where}.wall_s (covers every stamp and every tick)", True,
                rep["wall_s"] * 1e9 >= max(last, sum(t["tick_ns"] for t in ticks)))
    reps = [json.dumps([r["sessions"], [t["tick_ns"] for t in r["tick_records"]]]) for r in lv["repetitions"]]
    c.equal(RESULTS, f"{at}.repetitions (timing never byte-identical between two: a copy, not a run)",
            len(reps), len(set(reps)))
    m = re.search(r"--repeat[ =](\d+)", data["command"])
    if m:
        c.equal(RESULTS, "config.repeat (= the recorded command's --repeat)", int(m.group(1)),
                data["config"]["repeat"])


def _ordered(stamps: list) -> bool:
    present = [x for x in stamps if x is not None]
    return all(a <= b for a, b in zip(present, present[1:]))


def check_tick_ends(c: Checks, data: dict, lv: dict, at: str) -> None:
    """Who ended in a tick agrees with how the sessions ended (single-epoch levels), a session taken from the
    queue was queued and submitted by then and prefilled only after, and prefill pieces stay in budget."""
    budget = lv["budget"]["max_prefill_tokens_per_tick"]
    chunked = data["config"]["prefill"] == "chunked"
    for t in lv["tick_records"]:
        pieces = [n for _, _, n in t["prefill_chunks"]]
        # whole prompts: the first always runs (one larger than the budget still progresses), the rest fit
        ok = sum(pieces) <= budget if chunked or len(pieces) > 1 else True
        c.equal(RESULTS, f"{at}.tick_records[{t['tick']}].prefill_chunks (within the budget of {budget})", True, ok)
    if lv["engine_losses"]:
        return
    by_id = {s["session_id"]: s for s in lv["sessions"]}
    queued = {e["session_id"]: e["tick"] for e in lv["submit_events"] if e["decision"] == "QUEUED"}
    first_piece: dict[str, int] = {}
    for t in lv["tick_records"]:
        for sid, _, _ in t["prefill_chunks"]:
            first_piece.setdefault(sid, t["tick"])
    for t in lv["tick_records"]:
        where = f"{at}.tick_records[{t['tick']}]"
        for sid in t["completed"]:
            s = by_id.get(sid, {})
            c.equal(RESULTS, f"{where}.completed {sid} (ended COMPLETED in this tick)", ["COMPLETED", t["tick"]],
                    [s.get("done_reason"), s.get("end_tick")])
        for sid in t["ended"]:
            s = by_id.get(sid, {})
            c.equal(RESULTS, f"{where}.ended {sid} (ended otherwise in this tick)", [True, t["tick"]],
                    [s.get("done_reason") not in (None, "COMPLETED"), s.get("end_tick")])
        for sid in t["admitted"]:
            c.equal(RESULTS, f"{where}.admitted {sid} (queued at or before this tick, prefilled after it)", True,
                    sid in queued and queued[sid] <= t["tick"] and first_piece.get(sid, t["tick"] + 1) > t["tick"])


def _workload_ids(data: dict) -> list[str]:
    n = data["workload"]["sessions"]
    return [f"s{i:0{len(str(n - 1))}d}" for i in range(n)]


def check_sweep(c: Checks, data: dict) -> None:
    levels = data["levels"]
    div = figures.sweep_divergence(levels, data["reference"])
    v = verdicts.sweep_verdicts(levels, data["reference"])
    c.equal(RESULTS, "corruption_free (isolation at every level where it ran, no failed session)",
            v["corruption_free"], data["corruption_free"])
    c.equal(RESULTS, "batch_invariant (no divergence across levels)", div is None, data["batch_invariant"])
    c.equal(RESULTS, "isolation", v["isolation"], data["isolation"])
    c.equal(RESULTS, "batch_invariant (independent recomputation)",
            _plain_batch_invariant(levels, data["reference"]), data["batch_invariant"])
    found = data["first_divergence"]
    if found is not None:
        found = {k: found[k] for k in div} if div else found
    c.equal(RESULTS, "first_divergence", div, found)
    c.equal(RESULTS, "reference_concurrency", (data["reference"] or levels[0])["concurrency"],
            data["reference_concurrency"])
    c.equal(RESULTS, "reference (present exactly for a sweep of arrivals or of faults)",
            any(lv["arrivals"] != "all-at-once" or lv["faults"] for lv in levels), data["reference"] is not None)
    # The margin is meshbench's constant, not the bundle's to choose.
    c.equal(RESULTS, "saturation_margin", figures.SATURATION_MARGIN, data["saturation_margin"])
    at_once = [lv for lv in levels if lv["rate"] is None and not lv["faults"]]
    if at_once:
        conc = [lv["concurrency"] for lv in at_once]
        occ = [lv["avg_batch_occupancy"] for lv in at_once]
        c.equal(RESULTS, "saturation_concurrency", figures.saturation_level(conc, occ),
                data["saturation_concurrency"])
        c.equal(RESULTS, "saturation_concurrency (independent recomputation)", _plain_saturation(at_once),
                data["saturation_concurrency"])
    else:
        c.equal(RESULTS, "saturation_concurrency (none for a sweep of rates or faults)", None,
                data["saturation_concurrency"])
    c.equal(RESULTS, "saturation_rates", backpressure.saturation_rates(levels) if data["reference"] else None,
            data["saturation_rates"])


# --- the second way: plain loops over the raw records, nothing from figures.py ----------------
def _plain_tick_figures(ticks: list[dict]) -> dict:
    count = batch_ticks = batch_members = largest = prompt = generated = peak = 0
    for t in ticks:
        count += 1
        members = len(t["decode_sessions"])  # the ids, not the decode_batch field
        if members > 0:
            batch_ticks += 1
            batch_members += members
            largest = max(largest, members)
        prompt += t["prefill_tokens"]
        generated += t["decode_tokens"]
        peak = max(peak, t["kv_bytes"])
    return {
        "ticks": count,
        "avg_batch_occupancy": batch_members / batch_ticks if batch_ticks else 0.0,
        "max_batch_occupancy": largest,
        "tokens_per_tick": (prompt + generated) / count if count else 0.0,
        "peak_kv_bytes": peak,
        "prefill_tokens": prompt,
        "decode_tokens": generated,
    }


def _plain_batch_invariant(levels: list[dict], alone: dict | None) -> bool:
    """Every session's tokens agree with the reference's (the sessions run alone, else the first level's)
    on their common part."""
    reference = {}
    for s in (alone or levels[0])["sessions"]:
        reference[s["session_id"]] = s["tokens"]
    for lv in levels:
        for s in lv["sessions"]:
            ref = reference.get(s["session_id"])
            if ref is not None:
                common = min(len(ref), len(s["tokens"]))
                if ref[:common] != s["tokens"][:common]:
                    return False
    return True


def _plain_saturation(levels: list[dict]) -> int:
    """The first level whose next level raises average occupancy by 5% or less; else the last level."""
    for here, after in zip(levels, levels[1:]):
        if after["avg_batch_occupancy"] <= here["avg_batch_occupancy"] * 1.05:
            return here["concurrency"]
    return levels[-1]["concurrency"]
