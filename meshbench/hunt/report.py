"""A hunt as JSON (hunt.json) and in words: what was checked, what the server's cache did, the findings with
their minimal histories, and the coverage a clean hunt rests on."""

from __future__ import annotations

import dataclasses
from typing import Any

from meshbench.hunt import history as hist
from meshbench.hunt.judge import CONFIDENT, NEAR_TIE, NOT_JUDGED, SAME, UNKNOWN, Judged, donor
from meshbench.hunt.run import CONFIRM, Checked, Finding, Hunt, numerics_said
from meshbench.records import serial

OUTCOMES = (SAME, NEAR_TIE, CONFIDENT, UNKNOWN, NOT_JUDGED)


def coverage(checked: list[Checked], head: int) -> dict[str, Any]:
    """What the histories exercised, as the server reported it: answers whose prompt it took partly from its cache
    (fewer ids computed than evaluated by more than the ``head`` every prompt starts with), and those ids; by
    strategy."""
    out: dict[str, dict[str, int]] = {}
    for c in checked:
        s = out.setdefault(c.history.strategy, {"histories": 0, "requests": 0, "cache_hits": 0, "ids_reused": 0})
        s["histories"] += 1
        for x in c.answers.values():
            s["requests"] += 1
            reused = (x.evaluated or 0) - (x.computed if x.computed is not None else x.evaluated or 0)
            if x.error is None and reused > head:
                s["cache_hits"] += 1
                s["ids_reused"] += reused
    return out


def outcomes(checked: list[Checked]) -> dict[str, int]:
    every = [j.outcome for c in checked for j in c.judged]
    return {o: every.count(o) for o in OUTCOMES}


def to_json(h: Hunt, server: dict[str, Any]) -> dict[str, Any]:
    minutes = max(h.seconds, 1e-9) / 60
    return {
        "kind": "hunt",
        "version": 1,
        "server": server,
        "seed": h.seed,
        "strategies": h.strategies,
        "facts": {k: v for k, v in dataclasses.asdict(h.facts).items() if k != "pool"} | {"pool": len(h.facts.pool)},
        "cold_answers": h.how_cold,
        "replays_on": h.replays_on,
        "near_tie": h.threshold,
        "numerics": numerics_said(h.calibration),
        "seconds": round(h.seconds, 1),
        "histories": len(h.checked),
        "requests": sum(len(c.history.requests()) for c in h.checked),
        "histories_per_minute": round(len(h.checked) / minutes, 2),
        "outcomes": outcomes(h.checked),
        "coverage": coverage(h.checked, len(h.facts.head)),
        "findings": [_finding(f) for f in h.findings],
    }


def _finding(f: Finding) -> dict[str, Any]:
    m = f.minimal if f.minimal is not None else f.found
    return {
        "strategy": f.found.history.strategy,
        "seconds_to_find": round(f.seconds_to_find, 1),
        "confirmed": f"{f.confirmed} of {CONFIRM}",
        "history_size": list(f.found.history.size()),
        "minimal_size": list(m.history.size()),
        "minimal_confirmed": f"{f.minimal_confirmed} of {CONFIRM}",
        "minimal": hist.to_json(m.history),
        "differences": [_difference(m, j) for j in m.judged if j.outcome == CONFIDENT],
    }


def _difference(c: Checked, j: Judged) -> dict[str, Any]:
    r = next(x for x in c.history.requests() if x.name == j.name)
    others = {x.name: x.prompt for x in c.history.requests() if x.name != j.name}
    return {
        "request": j.name,
        "carries": r.carries,
        "continues": donor(c.answers[j.name], j.token_index or 0, r.prompt, others),
        "beside": list(j.beside),
        "token_index": j.token_index,
        "cold_margin": j.margin,
        "answer": serial.to_json(c.answers[j.name]).get("tokens"),
        "cold": serial.to_json(c.cold[j.name]).get("tokens"),
    }


def lines(h: Hunt) -> list[str]:
    """The hunt in words, findings first."""
    out = []
    for k, f in enumerate(h.findings, 1):
        m = f.minimal or f.found
        steps, reqs, ids = m.history.size()
        out.append(
            f"finding {k} ({f.found.history.strategy}, after {f.seconds_to_find:.0f} s): confirmed {f.confirmed} of "
            f"{CONFIRM}; minimal history {steps} steps, {reqs} requests, {ids} prompt ids, shown {f.minimal_confirmed}"
            f" of {CONFIRM} times on {h.replays_on}"
        )
        for j in m.judged:
            if j.outcome == CONFIDENT:
                out.append("  " + said(m, j))
    if not h.findings:
        out.append("nothing confident found")
    o = outcomes(h.checked)
    out.append(f"{len(h.checked)} histories, {sum(o.values())} answers in {h.seconds:.0f} s: " + ", ".join(
        f"{n} {k}" for k, n in o.items()))  # fmt: skip
    for name, s in coverage(h.checked, len(h.facts.head)).items():
        out.append(f"  {name}: {s['histories']} histories, {s['requests']} requests, {s['cache_hits']} served partly "
                   f"from the prompt cache beyond its first id ({s['ids_reused']} ids reused)")  # fmt: skip
    out.append(f"a near-tie is a cold margin of at most {h.threshold:.3g}; cold answers: {h.how_cold}")
    return out


def said(c: Checked, j: Judged) -> str:
    """One confident difference in words: the request, what it carried, where it differs, the cold margin there,
    what was sent beside it, and whose content its answer continues where another request's does."""
    r = next(x for x in c.history.requests() if x.name == j.name)
    others = {x.name: x.prompt for x in c.history.requests() if x.name != j.name}
    src = donor(c.answers[j.name], j.token_index or 0, r.prompt, others)
    margin = "unknown" if j.margin is None else f"{j.margin:.3g}"
    return (
        f"{j.name} ({r.carries}) first differs from its cold answer at token {j.token_index}, cold margin {margin}, "
        f"beside {', '.join(j.beside) or 'nothing'}" + (f"; its answer continues {src}'s content" if src else "")
    )
