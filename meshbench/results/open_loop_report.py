"""The endpoint README's section on the open-loop passes: per rate, what the server did with sessions that
arrived on their own clock, whatever was in flight."""

from __future__ import annotations

from typing import Any

import numpy as np

from meshbench.analysis import endpoint as figures
from meshbench.analysis import endpoint_margins, latency
from meshbench.records.endpoint_figures import LevelFigures, Spread
from meshbench.results.markdown import median_range
from meshbench.results.typed import EndpointBundle
from meshbench.workload import open_loop


def cell(spread: Spread | None, digits: int) -> str:
    return median_range(spread, f".{digits}f", sep="..", drop_equal=True)


def _kinds(answers: list[Any], cold: dict[str, Any], threshold: float) -> str:
    found = [
        endpoint_margins.divergence(0, None, a.session_id, a, cold[a.session_id], [], threshold)
        for a in answers
        if a.error is None and a.session_id in cold
    ]
    kinds = [d.kind for d in found if d is not None]
    unknown = kinds.count("unknown")
    return f"{kinds.count('near-tie')} / {kinds.count('confident')}" + (f" ({unknown} unknown)" if unknown else "")


def _p(values: list[float], q: int, digits: int = 1) -> str:
    return "-" if not values else f"{float(np.percentile(values, q)):.{digits}f}"


def figure_cells(f: LevelFigures) -> list[str]:
    """The open-loop table's figures, in its columns' order, with their digits."""
    return [cell(f.tokens_per_s, 1), cell(f.ttft_ms_p50, 1), cell(f.ttft_ms_p99, 1), cell(f.e2e_ms_p50, 1),
            cell(f.goodput_per_s, 2)]  # fmt: skip


def section(b: EndpointBundle) -> list[str]:
    r = b.results
    if not r.rates:
        return []
    slo = b.cfg.slo
    bounds = (("ttft", slo.ttft), ("tpot", slo.tpot))
    within = ", ".join(f"{k} <= {v:g} ms" for k, v in bounds if v is not None) or "none set: every session"
    rows = []
    cold = endpoint_margins.cold_answers(r.margins)
    threshold = endpoint_margins.near_tie(r.margins)
    for x in r.rates:
        answers = [a for rep in x.repetitions for a in rep.sessions]
        refused = sum(a.error is not None and a.error.startswith(("HTTP 429", "HTTP 503")) for a in answers)
        differ = figures.differing_from_reference(r.levels, answers, r.verdicts.compared)
        classify = cold and endpoint_margins.compares(r.endpoint.api, r.verdicts.compared, b.cfg.engine.temperature)
        kinds = _kinds(answers, cold, threshold) if r.verdicts.compared == "tokens" and classify else "-"
        rate = open_loop.offered(x.arrival_s)
        due = [(a, t) for rep in x.repetitions for a, t in zip(rep.sessions, x.arrival_s)]
        late = [open_loop.lateness_s(a.submit_ns, t) * 1e3 for a, t in due]
        timed = [(a, int(t * 1e9)) for a, t in due if a.error is None and a.token_ns]
        from_arrival = latency.samples([a for a, _ in timed], [t for _, t in timed]).ttft
        rows.append(
            f"| {x.rate:g} | {'-' if rate is None else f'{rate:.2f}'} | {x.arrivals} | {max(x.arrival_s):.2f} | "
            f"{sum(a.error is None for a in answers)} of {len(answers)} | {refused} | {len(differ)} | {kinds} | "
            + " | ".join(figure_cells(x.figures))
            + f" | {_p(from_arrival, 50)} | {_p(late, 99, 2)} / {_p(late, 100, 2)} |"
        )
    return [
        "## Open loop: sessions at a rate",
        "",
        f"At each rate (sessions per second), every session was submitted at its own arrival time on the wall "
        f"clock, drawn from the seed, by a client of its own, whatever was still in flight: the server's queue, "
        f"not the clients, decided when each was served; {len(r.rates[0].repetitions)} repetition(s), the same "
        f"arrival times each. Refused: answers of HTTP 429 or 503 (a server's backpressure); a server that queues "
        f"instead shows it in TTFT. Offered: the rate the drawn arrivals give (the gaps' count over their sum): "
        f"with a few sessions it can be far from the process's. Differ from C=ref: sessions whose output differs "
        f"from the reference level's. Differ from cold: answers that differ from their session's cold answer, "
        f"by the cold margin where they first differ (as the closed-loop levels' are; the verdicts above judge "
        f"the closed-loop levels only). "
        f"Goodput: sessions per second within the SLO ({within}). Medians over the repetitions, min..max. "
        "TTFT is timed from each request's submission, as in the closed-loop table; TTFT from arrival is timed "
        "from its scheduled arrival, pooled over the repetitions, and submitted late is how long after its arrival "
        "a request went out (a client that falls behind its arrivals hides the queue a real user meets: verify "
        f"fails a pass with a request {open_loop.MAX_LATE_S:g} s late).",
        "",
        "| rate /s | offered /s | arrivals | last arrival s | answered | refused | differ from C=ref | differ from "
        "cold: near-tie / confident | tok/s | TTFT p50 ms | TTFT p99 ms | E2E p50 ms | goodput /s | TTFT from "
        "arrival p50 ms | submitted late p99 / max ms |",
        "|" + "---|" * 15,
        *rows,
        "",
    ]
