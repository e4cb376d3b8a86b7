"""An endpoint's open-loop passes, planned: for each rate (sessions per second, ascending), the arrival process
at that rate and each session's submission time, drawn from the seed. The runner submits on it; verify draws it
again and holds the record to it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from meshbench.errors import MeshbenchError
from meshbench.workload import arrivals

MAX_ARRIVAL_S = 3600.0  # an open-loop pass whose last session arrives later than this is a typo, not a workload
MAX_LATE_S = 1.0  # a session submitted this long after its arrival: the client fell behind, the pass is not open


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
        try:
            times = [float(t) for t in at.seconds(sessions, seed)]
        except MeshbenchError:  # (arrivals beyond the node's tick bound: said here in seconds)
            times = [float("inf")]
        if max(times) > MAX_ARRIVAL_S:
            when = f"after {max(times):.0f} s" if max(times) < float("inf") else "too late to count"
            raise MeshbenchError(
                f"--rates {r:g}: the last of {sessions} sessions would arrive {when}, beyond the "
                f"{MAX_ARRIVAL_S:.0f} s an open-loop pass may take: a higher rate or fewer sessions"
            )
        out.append(RatePlan(r, at.label(), times))
    return out


def offered(arrival_s: list[float]) -> float | None:
    """The rate the drawn arrivals offer (sessions per second: the gaps' count over their sum), which a few
    sessions' draw can put far from the process's rate; None for one session."""
    span = max(arrival_s) - min(arrival_s)
    return (len(arrival_s) - 1) / span if len(arrival_s) > 1 and span > 0 else None


def lateness_s(submit_ns: int, due_s: float) -> float:
    """How long after its arrival a session was submitted (s)."""
    return submit_ns / 1e9 - due_s
