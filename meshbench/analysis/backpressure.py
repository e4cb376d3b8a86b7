"""What a level's arrivals met: admissions, the queue, waits in ticks, and goodput (pure, on the level's records).

Every figure comes from a level's submit events (one per arrival: its tick, the decision,
and the active and queued counts at that moment), its tick records and its sessions, so
``verify`` recomputes them all. Times are in ticks: a session's TTFT counts the ticks from
its arrival tick to the one that produced its first token, both included; its queue wait
the ticks from its arrival to the first tick it could be prefilled in; its TPOT the mean
ticks between its tokens after the first. Goodput (DistServe's definition, as vLLM
reports it) counts the completed sessions within every SLO given.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from meshbench.analysis import latency
from meshbench.records.context import Slo
from meshbench.records.model import Backpressure, JsonObject, LevelRecord, SessionRecord, SubmitEvent, Timing
from meshbench.records.tick import Tick
from meshbench.records.turns import turn_numbers
from meshbench.scheduler.budget import ACCEPTED

REJECTIONS = ("REJECTED_KV_BUDGET", "REJECTED_SCRATCH_BUDGET", "REJECTED_QUEUE_FULL", "REJECTED_DUPLICATE")


@dataclass(slots=True)
class _OnTicks:
    """An accepted session on the tick clock: its arrival, admission (first prefillable tick) and token ticks."""

    arrival: int
    admit: int | None
    tokens: list[int] = field(default_factory=list)


def session_ticks(events: Sequence[SubmitEvent], ticks: Sequence[Tick]) -> dict[str, _OnTicks]:
    """Per accepted session: arrival, admission and token ticks, until it completed (a conversation counts
    once, by its first turn, as on the wall clock: a later turn's ticks would add its wait and prefill to the
    conversation's gaps between tokens)."""
    out = {
        e.session_id: _OnTicks(e.tick, e.tick if e.decision == "ADMITTED" else None)
        for e in events
        if e.decision in ACCEPTED
    }
    done: set[str] = set()
    for t in ticks:  # ids that no event accepted are verify's to report, not counted here
        for sid in (*t.prefill_sessions, *t.decode_sessions):
            if sid in out and sid not in done:
                out[sid].tokens.append(t.tick)
        for sid in t.admitted:
            if sid in out and sid not in done:
                out[sid].admit = t.tick + 1
        done.update(t.completed)
    return out


def figures(
    events: Sequence[SubmitEvent],
    ticks: Sequence[Tick],
    sessions: Sequence[SessionRecord],
    slo: Slo,
    wall: tuple[Sequence[Timing], float] | None = None,
) -> Backpressure:
    """A level's backpressure record: on the tick clock, or (``wall``: the first repetition's session stamps and
    its wall time) on the wall clock too, where the SLO is in ms and goodput is per second."""
    on_ticks = _on_ticks(events, ticks, sessions, Slo() if wall else slo)
    on_wall = _on_wall(events, sessions, wall[0], wall[1], slo) if wall else {}
    return Backpressure(**on_ticks, **on_wall)


def _on_ticks(
    events: Sequence[SubmitEvent], ticks: Sequence[Tick], sessions: Sequence[SessionRecord], slo: Slo
) -> JsonObject:
    """A level's admissions, queue, waits, TTFT and TPOT in ticks, and goodput per 100 ticks."""
    decisions = Counter(e.decision for e in events)
    ended = {s.session_id: s.done_reason for s in sessions}
    waits: list[float] = []
    ttft: list[float] = []
    tpot: list[float] = []
    good = 0
    for sid, x in session_ticks(events, ticks).items():
        if x.admit is not None:
            waits.append(x.admit - x.arrival)
        if x.tokens:  # a token made in tick t is there at the end of t: its TTFT counts tick t
            ttft.append(latency.ttft_ms(x.tokens, x.arrival - 1, 1))
        gap = latency.tpot_ms(x.tokens, 1)
        if gap is not None:
            tpot.append(gap)
        if ended.get(sid) == "COMPLETED" and (not x.tokens or latency.within_slo(x.tokens, x.arrival - 1, slo, 1)):
            good += 1
    n = len(ticks)
    completed = sum(r == "COMPLETED" for r in ended.values())
    depth = [t.queued for t in ticks]

    def per_100(k: int) -> float:
        return 100.0 * k / n if n else 0.0

    return {
        "offered": len(events),
        "admitted_at_once": decisions["ADMITTED"],
        "queued": decisions["QUEUED"],
        "rejected_by_reason": {r: decisions[r] for r in REJECTIONS if decisions[r]},
        "completed": completed,
        "queue_depth_max": max(depth, default=0),
        "queue_depth_mean": float(np.mean(depth)) if depth else 0.0,
        "queue_wait_ticks": latency.percentiles(waits, (50, 95), with_max=True),
        "ttft_ticks": latency.percentiles(ttft, with_max=True),
        "tpot_ticks": latency.percentiles(tpot, with_max=True),
        "good_sessions": good,
        "offered_per_100_ticks": per_100(len(events)),
        "accepted_per_100_ticks": per_100(decisions["ADMITTED"] + decisions["QUEUED"]),
        "rejected_per_100_ticks": per_100(sum(decisions[r] for r in REJECTIONS)),
        "completed_per_100_ticks": per_100(completed),
        "goodput_per_100_ticks": per_100(good),
    }


def _on_wall(
    events: Sequence[SubmitEvent],
    sessions: Sequence[SessionRecord],
    timing: Sequence[Timing],
    wall_s: float,
    slo: Slo,
) -> JsonObject:
    """The wall clock: waits and TTFT in ms from each session's arrival time, and rates per second. A
    conversation counts once, as on the tick clock: by its first turn's wait and TTFT, good if it completed.

    ``timing`` is the first repetition's session stamps (ns from the start of the pass)."""
    arrival = {e.session_id: e.arrival_ms or 0.0 for e in events}
    ended = {s.session_id: s.done_reason for s in sessions}
    turn = turn_numbers(sessions)
    waits: list[float] = []
    ttft: list[float] = []
    good = 0
    for s in timing:
        if turn.get((s.session_id, s.epoch), 1) > 1:
            continue  # a later turn (its first turn stands for the conversation)
        a = arrival[s.session_id]
        if s.admit_ns is not None:
            waits.append(s.admit_ns / 1e6 - a)
        if not s.token_ns:
            continue
        first = s.token_ns[0] / 1e6 - a  # from the arrival, on the ms clock the arrivals were drawn on
        ttft.append(first)
        if ended.get(s.session_id) == "COMPLETED" and slo.meets(first, latency.tpot_ms(s.token_ns)):
            good += 1
    decisions = Counter(e.decision for e in events)

    def per_s(k: int) -> float:
        return k / wall_s if wall_s > 0 else 0.0

    return {
        "queue_wait_ms": latency.percentiles(waits, (50, 95), with_max=True),
        "ttft_from_arrival_ms": latency.percentiles(ttft, with_max=True),
        "offered_per_s": per_s(len(events)),
        "accepted_per_s": per_s(decisions["ADMITTED"] + decisions["QUEUED"]),
        "rejected_per_s": per_s(sum(decisions[r] for r in REJECTIONS)),
        "completed_per_s": per_s(sum(r == "COMPLETED" for r in ended.values())),
        "good_sessions_wall": good,
        "goodput_per_s": per_s(good),
    }


def saturation_rates(levels: Sequence[LevelRecord]) -> dict[int, float | None]:
    """Per concurrency, the lowest offered rate at which a full queue refused a session (None: never)."""
    out: dict[int, float | None] = {}
    for lv in sorted((lv for lv in levels if lv.rate is not None), key=lambda lv: lv.rate or 0.0):
        key = lv.concurrency
        out.setdefault(key, None)
        if out[key] is None and lv.backpressure.rejected_by_reason.get("REJECTED_QUEUE_FULL"):
            out[key] = lv.rate
    return out
