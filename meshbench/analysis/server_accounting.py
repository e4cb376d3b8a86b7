"""A server's own accounting of one pass, from its ``/metrics`` scraped before and after it: how many prompt tokens
it computed and how many it took from its prompt cache, how many decode calls it made, how many tokens it
predicted, and how many slots were busy per decode call.

llama-server's counters (``*_total``) only grow, so a pass's count is their difference. Its
``n_busy_slots_per_decode`` is a ratio since the server started (busy slots summed over decode calls, over the
decode calls): the pass's own ratio is ``(after * decodes_after - before * decodes_before) / decodes in the pass``.
A metric that is missing from either scrape, or a counter that went down (the server restarted), gives no figure;
nor does the busy-slot ratio where its printed precision (6 significant digits, multiplied back by every decode
call since the server started) could be off by more than 0.01 slots per call: a server up for long.

Its gauges (requests in a slot, requests waiting for one) are sampled while the pass runs
(meshbench.endpoint.gauges): a pass's figures are their largest values and the mean of the deferred count over
its samples.
"""

from __future__ import annotations

from typing import Mapping, Sequence

from meshbench.records.model import GaugeSample

PREFIX = "llamacpp:"
# (the figure, its llama-server counter), in the order the README shows them
COUNTERS = (
    ("prompt tokens computed", "prompt_tokens_total"),
    ("prompt tokens from the cache", "prompt_tokens_cached_total"),
    ("decode calls", "n_decode_total"),
    ("tokens predicted", "tokens_predicted_total"),
)
BUSY = "busy slots per decode"
FIGURES = (*(name for name, _ in COUNTERS), BUSY)

Scrape = Mapping[str, float] | None


def pass_accounting(before: Scrape, after: Scrape) -> dict[str, float | None]:
    """One pass's figures (None where the scrapes do not give one)."""
    out: dict[str, float | None] = {name: _delta(before, after, PREFIX + key) for name, key in COUNTERS}
    out[BUSY] = _busy(before, after)
    return out


def _delta(before: Scrape, after: Scrape, key: str) -> float | None:
    if before is None or after is None or key not in before or key not in after:
        return None
    d = after[key] - before[key]
    return d if d >= 0 else None


def _busy(before: Scrape, after: Scrape) -> float | None:
    decodes = _delta(before, after, PREFIX + "n_decode_total")
    ratio = PREFIX + "n_busy_slots_per_decode"
    if not decodes or before is None or after is None or ratio not in before or ratio not in after:
        return None
    n_after, n_before = after[PREFIX + "n_decode_total"], before[PREFIX + "n_decode_total"]
    busy = after[ratio] * n_after - before[ratio] * n_before
    # the ratio is printed to 6 significant digits: each product is off by up to half a unit of the 6th digit
    # times the decode calls since start; beyond 0.01 slots per decode call, no figure
    error = sum(abs(r) * n for r, n in ((after[ratio], n_after), (before[ratio], n_before))) * 5e-6 / decodes
    return round(busy / decodes, 3) if busy >= 0 and error <= 0.01 else None


def level_accounting(passes: Sequence[tuple[Scrape, Scrape]]) -> dict[str, list[float]]:
    """Each figure over a level's passes (the passes that give it)."""
    per_pass = [pass_accounting(b, a) for b, a in passes]
    return {name: [v for p in per_pass if (v := p[name]) is not None] for name in FIGURES}


SAMPLE_INTERVAL_S = 0.1  # how often the gauges are read while a pass runs (meshbench.endpoint.gauges)
GAUGE_KEYS = (PREFIX + "requests_processing", PREFIX + "requests_deferred")  # (in a slot, waiting for one)
GAUGES = ("requests processing, max", "requests deferred, max", "requests deferred, mean")


def pass_gauges(samples: Sequence[GaugeSample] | None) -> dict[str, float] | None:
    """One pass's gauge figures (None: no samples)."""
    if not samples:
        return None
    deferred = [s.deferred for s in samples]
    return dict(zip(GAUGES, (max(s.processing for s in samples), max(deferred), sum(deferred) / len(deferred))))


def level_gauges(passes: Sequence[Sequence[GaugeSample] | None]) -> dict[str, list[float]]:
    """Each gauge figure over a level's passes (the passes sampled)."""
    per_pass = [g for p in passes if (g := pass_gauges(p)) is not None]
    return {name: [g[name] for g in per_pass] for name in GAUGES}
