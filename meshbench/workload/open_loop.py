"""An endpoint's open-loop passes, planned: for each rate (sessions per second, ascending), the arrival process
at that rate and each session's submission time, drawn from the seed. The runner submits on it; verify draws it
again and holds the record to it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from meshbench.workload import arrivals


@dataclass(frozen=True, slots=True)
class RatePlan:
    rate: float
    arrivals: str  # the process exactly (Arrivals.label)
    arrival_s: list[float]  # each session's submission, s from the pass's start, in session order


def plan(process: str, rates: Sequence[float], sessions: int, seed: int) -> list[RatePlan]:
    base = arrivals.parse(process)
    out = []
    for r in sorted(rates):
        at = base.with_rate(r)
        out.append(RatePlan(r, at.label(), [float(t) for t in at.seconds(sessions, seed)]))
    return out
