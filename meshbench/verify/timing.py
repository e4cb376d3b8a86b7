"""Wall-clock data: not reproducible, so checked for plausibility (stamps in order, inside their pass and
tick, repetitions whose deterministic records equal the first)."""

from __future__ import annotations

import re
from typing import Any

from meshbench.analysis import figures
from meshbench.analysis.checks import Checks
from meshbench.names import RESULTS
from meshbench.records import serial
from meshbench.records.model import LevelRecord, Repetition
from meshbench.results.typed import NodeBundle


def check_repetitions(c: Checks, b: NodeBundle, lv: LevelRecord, at: str, index: int) -> None:
    """Every repetition ran the same deterministic pass: same ticks, same sessions, same tokens."""
    reps = lv.repetitions
    repeat = b.cfg.repeat
    c.equal(RESULTS, f"{at}.repetitions (count = config.repeat)", repeat, len(reps))
    count = len(b.results.levels)
    for i, rep in enumerate(reps):
        where = f"{at}.repetitions[{i}]"
        c.equal(RESULTS, f"{where}.repetition", i, rep.repetition)
        rotated = list(range(i % count, count)) + list(range(i % count))
        c.equal(
            RESULTS, f"{where}.position (level order rotated by the repetition)", rotated.index(index), rep.position
        )
        if b.cfg.clock == "wall":
            continue  # admission depends on speed: repetitions differ by design, tokens are checked by the sweep
        c.equal(
            RESULTS,
            f"{where}.tick_records (deterministic fields = repetition 0's)",
            True,
            figures.deterministic_ticks(rep.tick_records) == lv.tick_records,
        )
        ends = [(s.session_id, s.epoch, s.digest, s.done_reason) for s in rep.sessions]
        c.equal(
            RESULTS,
            f"{where}.sessions (ids, epochs, digests, ends = repetition 0's)",
            [(s.session_id, s.epoch, s.digest, s.done_reason) for s in lv.sessions],
            ends,
        )


def check_wall(c: Checks, lv: LevelRecord, at: str) -> None:
    """Every repetition's wall-clock figures from its nanosecond stamps, and their summary."""
    for i, rep in enumerate(lv.repetitions):
        wall = serial.to_json(figures.wall_figures(rep.sessions, rep.tick_records, rep.wall_s))
        recorded = serial.to_json(rep.wall)
        for k, v in wall.items():
            c.equal(RESULTS, f"{at}.repetitions[{i}].wall.{k}", v, recorded[k])
    summary = serial.to_json(figures.repetition_summary([rep.wall for rep in lv.repetitions]))
    recorded = serial.to_json(lv.wall)
    c.equal(RESULTS, f"{at}.wall (summary) figures", sorted(summary), sorted(recorded))
    for k, v in summary.items():
        if k in recorded:
            c.equal(RESULTS, f"{at}.wall.{k}", v, recorded[k])


def check_timing(c: Checks, b: NodeBundle, lv: LevelRecord, at: str) -> None:
    """Timing that cannot happen, checked on every repetition: stamps out of order, a stamp per token missing
    or extra, a first token before the submit or the slot, engine time beyond its tick, a wall time shorter
    than what it covers, repetitions copied from one another."""
    tokens = {(s.session_id, s.epoch, s.digest): len(s.tokens) for s in lv.sessions}
    for i, rep in enumerate(lv.repetitions):
        where = f"{at}.repetitions[{i}]"
        last = 0
        for s in rep.sessions:
            stamps, who = s.token_ns, f"{where}.sessions {s.session_id}#{s.epoch}"
            count = tokens.get((s.session_id, s.epoch, s.digest))
            if count is not None:
                c.equal(RESULTS, f"{who}.token_ns (one stamp per token)", count, len(stamps))
            c.equal(
                RESULTS, f"{who}.token_ns (never decreasing)", True, all(a <= b for a, b in zip(stamps, stamps[1:]))
            )
            c.equal(
                RESULTS,
                f"{who} (0 <= submit <= admit <= first token)",
                True,
                _ordered([0, s.submit_ns, s.admit_ns, stamps[0] if stamps else None]),
            )
            last = max([last, s.submit_ns, *(stamps[-1:] or [0])])
        ticks = rep.tick_records
        bad = [t.tick for t in ticks if not _possible(t.tick_ns, t.decode_ns, t.prefill_ns)]
        c.equal(RESULTS, f"{where}.tick_records (0 <= decode_ns + prefill_ns <= tick_ns)", [], bad)
        c.equal(
            RESULTS,
            f"{where}.wall_s (covers every stamp and every tick)",
            True,
            rep.wall_s * 1e9 >= max(last, sum(t.tick_ns or 0 for t in ticks)),
        )
    c.equal(
        RESULTS,
        f"{at}.repetitions (no two with {COPY_SHARE:.0%} of their stamps within {COPY_NS} ns: a copy, not a run)",
        [],
        _copies(lv.repetitions),
    )
    if b.cfg.clock == "tick":
        _check_stamps_after_ticks(c, lv, at)
    m = re.search(r"--repeat[ =](\d+)", b.results.command)
    if m:
        c.equal(RESULTS, "config.repeat (= the recorded command's --repeat)", int(m.group(1)), b.cfg.repeat)


COPY_NS = 1000  # two real passes differ by far more in most of their stamps; a copy with jitter does not
COPY_SHARE = 0.9  # a pair with this share of its stamps within COPY_NS of each other is a copy
COPY_MIN_STAMPS = 8  # fewer stamps than this cannot tell a copy from a run (a level of one short session)


def _stamps(rep: Repetition) -> list[int]:
    """Each tick's duration and each token's arrival: the stamps two runs cannot share."""
    out = [t.tick_ns or 0 for t in rep.tick_records]
    for s in rep.sessions:
        out += s.token_ns
    return out


def _copies(reps: list[Repetition]) -> list[list[int]]:
    """Pairs of repetitions with COPY_SHARE or more of their stamps within COPY_NS of the other's."""
    stamps = [_stamps(r) for r in reps]
    out = []
    for i in range(len(reps)):
        for j in range(i + 1, len(reps)):
            a, b = stamps[i], stamps[j]
            if len(a) != len(b) or len(a) < COPY_MIN_STAMPS:
                continue
            close = sum(abs(x - y) < COPY_NS for x, y in zip(a, b))
            if close >= COPY_SHARE * len(a):
                out.append([i, j])
    return out


def _check_stamps_after_ticks(c: Checks, lv: LevelRecord, at: str) -> None:
    """On the tick clock the ticks run back to back from the pass's start, so the tick that made a token ended
    no earlier than the sum of the durations before it: a token stamped earlier was never measured. Checked for
    the sessions of one epoch that completed (their tokens' ticks are the record's: the last prompt chunk, then
    each decode)."""
    epochs = [s.session_id for s in lv.sessions]
    if len(set(epochs)) != len(epochs):
        return  # (a resubmitted session's ticks are shared by its epochs)
    made: dict[str, list[int]] = {}
    prompt = {s.session_id: s.prompt_tokens for s in lv.sessions}
    for t in lv.tick_records:
        for sid, start, n in t.prefill_chunks:
            if start + n == prompt.get(sid):
                made.setdefault(sid, []).append(t.tick)
        for sid in t.decode_sessions:
            made.setdefault(sid, []).append(t.tick)
    for i, rep in enumerate(lv.repetitions):
        ends = [0]
        for t in rep.tick_records:
            ends.append(ends[-1] + (t.tick_ns or 0))  # ends[k]: the ticks before tick k took this long
        early = [
            f"{s.session_id} token {k}"
            for s in rep.sessions
            if s.done_reason == "COMPLETED" and len(made.get(s.session_id, [])) == len(s.token_ns)
            for k, (tick, stamp) in enumerate(zip(made[s.session_id], s.token_ns))
            if tick < len(ends) and stamp < ends[tick]
        ]
        c.equal(RESULTS, f"{at}.repetitions[{i}] token stamps (none before the ticks that preceded it)", [], early[:5])


def _ordered(stamps: list[Any]) -> bool:
    present = [x for x in stamps if x is not None]
    return all(a <= b for a, b in zip(present, present[1:]))


def _possible(tick: int | None, decode: int | None, prefill: int | None) -> bool:
    """A repetition's tick is timed whole (a missing figure is impossible there), its engine time within it."""
    if tick is None or decode is None or prefill is None:
        return False
    return 0 <= decode + prefill <= tick and min(decode, prefill) >= 0
