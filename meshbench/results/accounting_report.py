"""The endpoint README's section on the server's own accounting (meshbench.analysis.server_accounting): its
counters' differences over every pass, and its request gauges sampled while the pass ran, per closed-loop level
and per open-loop rate."""

from __future__ import annotations

import statistics
from typing import Sequence

from meshbench.analysis import server_accounting as accounting
from meshbench.records.model import EndpointRepetition
from meshbench.results.typed import EndpointBundle


def spread(values: list[float]) -> str:
    """A per-pass figure over the repetitions: the median, and min..max where they differ."""
    if not values:
        return "-"
    fmt = ".0f" if all(float(v).is_integer() for v in values) else ".2f"
    med, lo, hi = (format(x, fmt) for x in (statistics.median(values), min(values), max(values)))
    return med if lo == hi else f"{med} ({lo}..{hi})"


def _row(label: str, reps: Sequence[EndpointRepetition], sampled: bool) -> str | None:
    counters = accounting.level_accounting([(rep.metrics_before, rep.metrics_after) for rep in reps])
    gauges = accounting.level_gauges([rep.gauges for rep in reps])
    if not any(counters.values()) and not any(gauges.values()):
        return None
    cells = [spread(counters[k]) for k in accounting.FIGURES]
    if sampled:
        cells += [spread(gauges[k]) for k in accounting.GAUGES]
    return f"| {label} | " + " | ".join(cells) + " |"


def section(b: EndpointBundle) -> list[str]:
    """The section, or one line where the server exposes no accounting. A bundle with the gauges sampled (made
    since they are) also has a row per open-loop rate."""
    r = b.results
    groups = [(str(lv.concurrency), lv.repetitions) for lv in r.levels]
    rates = [(f"{x.rate:g} /s", x.repetitions) for x in r.rates or ()]
    sampled = any(rep.gauges for _, reps in [*groups, *rates] for rep in reps)
    shown = sampled or not b.cfg.engine.gauges  # (a bundle made before the gauges: levels only, as then)
    groups += rates if shown else []
    rows = [row for label, reps in groups if (row := _row(label, reps, sampled)) is not None]
    if not rows:
        return ["The server exposes no accounting of its own (`/metrics`, llama-server's counters).", ""]
    names = [*accounting.FIGURES, *(accounting.GAUGES if sampled else ())]
    gauges = (
        f" Requests processing and deferred are the server's gauges (requests in a slot, requests waiting for "
        f"one), read from `/metrics` about every {accounting.SAMPLE_INTERVAL_S:g} s while the pass ran: a pass's "
        "largest values and the mean of the deferred count over its samples, over the passes sampled. Rows: each "
        "closed-loop level (C), then each open-loop rate as asked (/s; the rate its arrivals offer is in the "
        "open-loop table)."
        if sampled
        else ""
    )
    return [
        "## The server's own accounting",
        "",
        "Per pass, from its `/metrics` scraped before and after every pass (counters' differences); median "
        "(min..max) over the repetitions. Prompt tokens from the cache are those the server did not compute "
        f"because its prompt cache held them.{gauges}{_beyond(b)}",
        "",
        ("| C or rate | " if shown else "| C | ") + " | ".join(names) + " |",
        "|" + "---|" * (len(names) + 1),
        *rows,
        "",
    ]


def _beyond(b: EndpointBundle) -> str:
    """A caveat where the server's gauges count more requests in flight than a closed-loop pass sent (on a server
    meshbench did not start, where verify cannot hold them to the pass: other clients, or gauges not to trust)."""
    if b.results.endpoint.launched is not None:  # (verify holds a server meshbench started to the pass)
        return ""
    over = [
        (lv.concurrency, most)
        for lv in b.results.levels
        if (most := max((s.processing + s.deferred for rep in lv.repetitions for s in rep.gauges or ()), default=0))
        > lv.concurrency
    ]
    if not over:
        return ""
    c, most = over[0]
    return (
        f" **The server's gauges count more requests than meshbench sent** ({most:g} processing or deferred at C={c}"
        + (f", and at {len(over) - 1} more levels" if len(over) > 1 else "")
        + "): other clients shared the server, or its gauges are not to be trusted; they are not this load's."
    )
