"""An endpoint bundle's sampled gauges checked against what the pass allows: samples in time order within the
pass, at most the server's slots in a slot, and, on a server meshbench started (no other client), at most the
pass's sessions in flight held or waiting (C closed-loop clients; an open-loop pass's sessions)."""

from __future__ import annotations

from meshbench.analysis.checks import Checks
from meshbench.names import RESULTS
from meshbench.records.model import EndpointRepetition
from meshbench.results.typed import EndpointBundle


def _passes(b: EndpointBundle) -> list[tuple[str, EndpointRepetition, int]]:
    """Every timed pass with the most sessions it can have in flight."""
    out = [
        (f"levels[{i}].repetitions[{r}]", rep, lv.concurrency)
        for i, lv in enumerate(b.results.levels)
        for r, rep in enumerate(lv.repetitions)
    ]
    out += [
        (f"rates[{k}].repetitions[{r}]", rep, len(rep.sessions))
        for k, x in enumerate(b.results.rates or ())
        for r, rep in enumerate(x.repetitions)
    ]
    return out


def check_gauges(c: Checks, b: EndpointBundle) -> None:
    own, slots = b.results.endpoint.launched is not None, b.results.endpoint.total_slots
    for at, rep, in_flight in _passes(b):
        if rep.gauges is None:
            continue
        times = [s.t_ms for s in rep.gauges]
        c.equal(
            RESULTS,
            f"{at}.gauges (in time order, within the pass's {rep.wall_s:g} s)",
            True,
            times == sorted(times) and times[-1] <= rep.wall_s * 1e3,
        )
        busiest = max(s.processing for s in rep.gauges)
        if slots is not None:
            c.equal(RESULTS, f"{at}.gauges: requests processing (at most the server's {slots} slots)", True,
                    busiest <= slots)  # fmt: skip
        if own:
            most = max(s.processing + s.deferred for s in rep.gauges)
            c.equal(RESULTS, f"{at}.gauges: requests processing + deferred (at most {in_flight} in flight)", True,
                    most <= in_flight)  # fmt: skip
