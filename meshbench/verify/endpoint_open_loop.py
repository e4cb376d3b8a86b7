"""An endpoint bundle's open-loop passes checked from their records: the arrival times drawn again from the
seed, every session once per repetition, submitted no earlier than its arrival, its stamps in order, and the
figures recomputed from the stamps."""

from __future__ import annotations

from meshbench.analysis import endpoint as figures
from meshbench.analysis.checks import Checks
from meshbench.errors import MeshbenchError
from meshbench.names import RESULTS
from meshbench.records.open_loop import EndpointRate
from meshbench.results.typed import EndpointBundle
from meshbench.workload import open_loop


def check_rates(c: Checks, b: EndpointBundle, ids: list[str], lengths: dict[str, int], new: dict[str, int]) -> None:
    cfg, rates = b.cfg, b.results.rates
    c.equal(
        RESULTS, "rates (recorded exactly where config.rates asks for them)", cfg.rates is not None, rates is not None
    )
    if rates is None or cfg.rates is None:
        return
    wl = cfg.workload
    try:
        planned = open_loop.plan(wl.arrivals, cfg.rates, wl.sessions, wl.seed)
    except MeshbenchError as e:
        c.equal(RESULTS, "rates (their arrivals drawn again from the seed)", "drawn", str(e))
        return
    c.equal(RESULTS, "rates (one per config rate, ascending)", [p.rate for p in planned], [r.rate for r in rates])
    for k, (p, r) in enumerate(zip(planned, rates)):
        at = f"rates[{k}]"
        c.equal(RESULTS, f"{at}.arrivals (the process at this rate)", p.arrivals, r.arrivals)
        c.equal(RESULTS, f"{at}.arrival_s (drawn again from the seed)", p.arrival_s, r.arrival_s)
        c.equal(RESULTS, f"{at}.repetitions (count = config.repeat)", cfg.repeat, len(r.repetitions))
        _check_passes(c, r, at, k, len(planned), ids)
        for i, rep in enumerate(r.repetitions):
            expected = figures.pass_figures(rep.sessions, rep.wall_s, lengths, cfg.slo, new)
            c.equal(RESULTS, f"{at}.repetitions[{i}].figures (recomputed from the stamps)", expected, rep.figures)
        summary = figures.summary([rep.figures for rep in r.repetitions])
        c.equal(RESULTS, f"{at}.figures (over the repetitions)", summary, r.figures)


def _check_passes(c: Checks, r: EndpointRate, at: str, index: int, count: int, ids: list[str]) -> None:
    """Every session once per repetition, in order, submitted at its arrival (never before, and within
    MAX_LATE_S after it: else the client fell behind and the pass was not open), its stamps within the pass; the
    rates' order rotated by the repetition, as the levels' is."""
    for i, rep in enumerate(r.repetitions):
        where = f"{at}.repetitions[{i}]"
        c.equal(RESULTS, f"{where}.repetition", i, rep.repetition)
        rotated = list(range(i % count, count)) + list(range(i % count))
        c.equal(RESULTS, f"{where}.position (the rates' order rotated by the repetition)", rotated.index(index),
                rep.position)  # fmt: skip
        c.equal(RESULTS, f"{where}.sessions (every session once, in order)", ids, [x.session_id for x in rep.sessions])
        late = [
            x.session_id
            for x, due in zip(rep.sessions, r.arrival_s)
            if not 0 <= open_loop.lateness_s(x.submit_ns, due) + 1e-9 <= open_loop.MAX_LATE_S
            or (x.token_ns and x.token_ns[-1] > rep.wall_s * 1e9 + 1e6)
        ]
        said = f"{where}: submitted at its arrival (at most {open_loop.MAX_LATE_S:g} s after), within the pass"
        c.equal(RESULTS, said, [], late)
