"""What a level's arrivals met: admissions, the queue, waits in ticks, and goodput (pure, on record dicts).

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
from typing import Sequence

import numpy as np

from meshbench.scheduler.budget import ACCEPTED

REJECTIONS = ("REJECTED_KV_BUDGET", "REJECTED_SCRATCH_BUDGET", "REJECTED_QUEUE_FULL", "REJECTED_DUPLICATE")


def _pct(values: Sequence[float], qs=(50, 95, 99)) -> dict:
    if not values:
        return {**{f"p{q}": None for q in qs}, "max": None}
    a = np.asarray(values, dtype=np.float64)
    return {**{f"p{q}": float(np.percentile(a, q)) for q in qs}, "max": float(a.max())}


def session_ticks(level: dict) -> dict[str, dict]:
    """Per accepted session: arrival, admission (first prefillable tick) and token ticks."""
    out = {
        e["session_id"]: {
            "arrival": e["tick"],
            "admit": e["tick"] if e["decision"] == "ADMITTED" else None,
            "tokens": [],
        }
        for e in level["submit_events"]
        if e["decision"] in ACCEPTED
    }
    for t in level["tick_records"]:  # ids that no event accepted are verify's to report, not counted here
        for sid in (*t["prefill_sessions"], *t["decode_sessions"]):
            if sid in out:
                out[sid]["tokens"].append(t["tick"])
        for sid in t["admitted"]:
            if sid in out:
                out[sid]["admit"] = t["tick"] + 1
    return out


def level_figures(level: dict, slo: dict) -> dict:
    events, ticks = level["submit_events"], level["tick_records"]
    decisions = Counter(e["decision"] for e in events)
    ended = {s["session_id"]: s["done_reason"] for s in level["sessions"]}
    per = session_ticks(level)
    waits, ttft, tpot, good = [], [], [], 0
    for sid, x in per.items():
        if x["admit"] is not None:
            waits.append(x["admit"] - x["arrival"])
        if x["tokens"]:
            ttft.append(x["tokens"][0] - x["arrival"] + 1)
        if len(x["tokens"]) > 1:
            tpot.append((x["tokens"][-1] - x["tokens"][0]) / (len(x["tokens"]) - 1))
        if ended.get(sid) == "COMPLETED" and _within(x, slo):
            good += 1
    n = len(ticks)
    completed = sum(r == "COMPLETED" for r in ended.values())
    depth = [t["queued"] for t in ticks]

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
        "queue_wait_ticks": _pct(waits, (50, 95)),
        "ttft_ticks": _pct(ttft),
        "tpot_ticks": _pct(tpot),
        "good_sessions": good,
        "offered_per_100_ticks": per_100(len(events)),
        "accepted_per_100_ticks": per_100(decisions["ADMITTED"] + decisions["QUEUED"]),
        "rejected_per_100_ticks": per_100(sum(decisions[r] for r in REJECTIONS)),
        "completed_per_100_ticks": per_100(completed),
        "goodput_per_100_ticks": per_100(good),
    }


def wall_figures(level: dict, timing: Sequence[dict], wall_s: float, slo: dict) -> dict:
    """The wall clock: waits and TTFT in ms from each session's arrival time, and rates per second.

    ``timing`` is the first repetition's session stamps (ns from the start of the pass)."""
    arrival = {e["session_id"]: e["arrival_ms"] for e in level["submit_events"]}
    ended = {s["session_id"]: s["done_reason"] for s in level["sessions"]}
    waits, ttft, good = [], [], 0
    for s in timing:
        a = arrival[s["session_id"]]
        if s["admit_ns"] is not None:
            waits.append(s["admit_ns"] / 1e6 - a)
        if not s["token_ns"]:
            continue
        first = s["token_ns"][0] / 1e6 - a
        ttft.append(first)
        gaps = len(s["token_ns"]) - 1
        tpot = (s["token_ns"][-1] - s["token_ns"][0]) / 1e6 / gaps if gaps else 0.0
        if (
            ended.get(s["session_id"]) == "COMPLETED"
            and (slo.get("ttft") is None or first <= slo["ttft"])
            and (slo.get("tpot") is None or tpot <= slo["tpot"])
        ):
            good += 1
    decisions = Counter(e["decision"] for e in level["submit_events"])

    def per_s(k: int) -> float:
        return k / wall_s if wall_s > 0 else 0.0

    return {
        "queue_wait_ms": _pct(waits, (50, 95)),
        "ttft_from_arrival_ms": _pct(ttft),
        "offered_per_s": per_s(len(level["submit_events"])),
        "accepted_per_s": per_s(decisions["ADMITTED"] + decisions["QUEUED"]),
        "rejected_per_s": per_s(sum(decisions[r] for r in REJECTIONS)),
        "completed_per_s": per_s(sum(r == "COMPLETED" for r in ended.values())),
        "good_sessions_wall": good,
        "goodput_per_s": per_s(good),
    }


def _within(x: dict, slo: dict) -> bool:
    if slo.get("ttft") is not None and x["tokens"][0] - x["arrival"] + 1 > slo["ttft"]:
        return False
    if slo.get("tpot") is not None and len(x["tokens"]) > 1:
        if (x["tokens"][-1] - x["tokens"][0]) / (len(x["tokens"]) - 1) > slo["tpot"]:
            return False
    return True


def saturation_rates(levels: Sequence[dict]) -> dict[str, float | None]:
    """Per concurrency, the lowest offered rate at which a full queue refused a session (None: never)."""
    out: dict[str, float | None] = {}
    for lv in sorted((lv for lv in levels if lv["rate"] is not None), key=lambda lv: lv["rate"]):
        key = str(lv["concurrency"])
        out.setdefault(key, None)
        if out[key] is None and lv["backpressure"]["rejected_by_reason"].get("REJECTED_QUEUE_FULL"):
            out[key] = lv["rate"]
    return out
