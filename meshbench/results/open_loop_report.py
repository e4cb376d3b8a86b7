"""The endpoint README's section on the open-loop passes: per rate, what the server did with sessions that
arrived on their own clock, whatever was in flight."""

from __future__ import annotations

import numpy as np

from meshbench.analysis import endpoint as figures
from meshbench.analysis import latency
from meshbench.results.markdown import median_range
from meshbench.results.typed import EndpointBundle
from meshbench.workload import open_loop


def cell(spread: dict[str, float] | None, digits: int) -> str:
    return median_range(spread, f".{digits}f", sep="..", drop_equal=True)


def _p(values: list[float], q: int, digits: int = 1) -> str:
    return "-" if not values else f"{float(np.percentile(values, q)):.{digits}f}"


COLUMNS = (("tokens_per_s", 1), ("ttft_ms.p50", 1), ("ttft_ms.p99", 1), ("e2e_ms.p50", 1), ("goodput_per_s", 2))


def section(b: EndpointBundle) -> list[str]:
    r = b.results
    if not r.rates:
        return []
    slo = b.cfg.slo or {}
    within = ", ".join(f"{k} <= {v:g} ms" for k, v in slo.items() if v is not None) or "none set: every session"
    rows = []
    for x in r.rates:
        answers = [a for rep in x.repetitions for a in rep.sessions]
        refused = sum(a.error is not None and a.error.startswith(("HTTP 429", "HTTP 503")) for a in answers)
        differ = figures.differing_from_reference(r.levels, answers, r.verdicts.compared)
        due = [(a, t) for rep in x.repetitions for a, t in zip(rep.sessions, x.arrival_s)]
        late = [open_loop.lateness_s(a.submit_ns, t) * 1e3 for a, t in due]
        timed = [(a, int(t * 1e9)) for a, t in due if a.error is None and a.token_ns]
        from_arrival = latency.samples([a for a, _ in timed], [t for _, t in timed]).ttft
        rows.append(
            f"| {x.rate:g} | {x.arrivals} | {max(x.arrival_s, default=0):.2f} | {sum(a.error is None for a in answers)}"
            f" of {len(answers)} | {refused} | {len(differ)} | "
            + " | ".join(cell(x.figures.get(k), d) for k, d in COLUMNS)
            + f" | {_p(from_arrival, 50)} | {_p(late, 99, 2)} / {_p(late, 100, 2)} |"
        )
    return [
        "## Open loop: sessions at a rate",
        "",
        f"At each rate (sessions per second), every session was submitted at its own arrival time on the wall "
        f"clock, drawn from the seed, by a client of its own, whatever was still in flight: the server's queue, "
        f"not the clients, decided when each was served; {len(r.rates[0].repetitions)} repetition(s), the same "
        f"arrival times each. Refused: answers of HTTP 429 or 503 (a server's backpressure); a server that queues "
        f"instead shows it in TTFT. Differ from C=ref: sessions whose output differs from the reference level's. "
        f"Goodput: sessions per second within the SLO ({within}). Medians over the repetitions, min..max. "
        "TTFT is timed from each request's submission, as in the closed-loop table; TTFT from arrival is timed "
        "from its scheduled arrival, pooled over the repetitions, and submitted late is how long after its arrival "
        "a request went out (a client that falls behind its arrivals hides the queue a real user meets: verify "
        f"fails a pass with a request {open_loop.MAX_LATE_S:g} s late).",
        "",
        "| rate /s | arrivals | last arrival s | answered | refused | differ from C=ref | tok/s | TTFT p50 ms | "
        "TTFT p99 ms | E2E p50 ms | goodput /s | TTFT from arrival p50 ms | submitted late p99 / max ms |",
        "|" + "---|" * 13,
        *rows,
        "",
    ]
