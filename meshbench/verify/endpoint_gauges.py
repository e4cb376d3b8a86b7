"""An endpoint bundle's sampled gauges checked against what the pass allows: read only from a server whose
scrapes around the pass have the gauges; each sent SAMPLE_INTERVAL_S after the last answer at the soonest and
answered within the pass; at most the server's slots in a slot; and, on a server meshbench started (no other
client), at most the pass's sessions in flight held or waiting: C closed-loop clients (an open-loop pass: its
sessions), plus one for each session that failed on the client's side (its client moves on while the server
may still hold the request it dropped)."""

from __future__ import annotations

from meshbench.analysis.checks import Checks
from meshbench.analysis.endpoint import pass_answers
from meshbench.analysis.server_accounting import GAUGE_KEYS, SAMPLE_INTERVAL_S
from meshbench.names import RESULTS
from meshbench.records.model import EndpointRepetition, GaugeSample
from meshbench.results.typed import EndpointBundle

# the sampler waits SAMPLE_INTERVAL_S after the pass's start and after each scrape's answer, to a monotonic
# deadline (5% for the timer's rounding)
MIN_GAP_MS = SAMPLE_INTERVAL_S * 1e3 * 0.95


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


def _spacing(samples: list[GaugeSample], wall_s: float) -> str:
    """The first sample out of its place ("ok": none): each sent at least MIN_GAP_MS after the pass's start and
    after the answer before it, answered after it was sent and within the pass."""
    last = 0.0
    for k, s in enumerate(samples):
        if s.t_ms - last < MIN_GAP_MS or s.answer_ms < s.t_ms or s.answer_ms > wall_s * 1e3:
            return f"gauges[{k}] sent at {s.t_ms:g} ms, answered at {s.answer_ms:g} ms"
        last = s.answer_ms
    return "ok"


def check_gauges(c: Checks, b: EndpointBundle) -> None:
    own, slots = b.results.endpoint.launched is not None, b.results.endpoint.total_slots
    for at, rep, clients in _passes(b):
        if rep.gauges is None:
            continue
        c.equal(RESULTS, f"{at}.gauges (sampled only with engine.gauges)", True, b.cfg.engine.gauges)
        around = [m for m in (rep.metrics_before, rep.metrics_after) if m is not None]  # (a scrape may fail)
        scraped = all(k in m for m in around for k in GAUGE_KEYS)
        c.equal(RESULTS, f"{at}.gauges (from a server whose scrapes around the pass have them)", True, scraped)
        c.equal(
            RESULTS,
            f"{at}.gauges (each sent {SAMPLE_INTERVAL_S:g} s after the last answer at the soonest, answered "
            f"within the pass's {rep.wall_s:g} s)",
            "ok",
            _spacing(rep.gauges, rep.wall_s),
        )
        busiest = max(s.processing for s in rep.gauges)
        if slots is not None:
            c.equal(RESULTS, f"{at}.gauges: most requests processing (at most the server's {slots} slots)",
                    min(busiest, slots), busiest)  # fmt: skip
        if own:
            dropped = sum(x.error is not None and not x.error.startswith("HTTP ") for x in pass_answers(rep))
            bound = clients + dropped
            most = max(s.processing + s.deferred for s in rep.gauges)
            c.equal(RESULTS, f"{at}.gauges: most requests processing + deferred (at most {bound} in flight)",
                    min(most, bound), most)  # fmt: skip
