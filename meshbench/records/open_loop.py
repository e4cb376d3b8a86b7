"""The records of an endpoint's open-loop passes: at each rate, every session submitted at its own arrival time
on the wall clock (a Poisson or gamma process, sessions per second, drawn from the seed), whatever is still in
flight; the server's queue, not meshbench's clients, decides when each is served."""

from __future__ import annotations

from dataclasses import dataclass

from meshbench.records.endpoint_figures import LevelFigures
from meshbench.records.model import EndpointRepetition


@dataclass(frozen=True, slots=True, kw_only=True)
class EndpointRate:
    rate: float  # sessions per second
    arrivals: str  # the process exactly (meshbench.workload.arrivals.Arrivals.label)
    arrival_s: list[float]  # each session's submission time, from the pass's start, in session order
    repetitions: list[EndpointRepetition]  # (position: the pass's place among the rates, ascending)
    figures: LevelFigures  # each figure's median, min and max over the repetitions
