"""Latency figures from one timing record, the same for a node's sessions and an endpoint's completions.

A timed session is a submit stamp, an admission stamp (None until a slot took it) and one stamp per token
received, in monotonic nanoseconds from the start of its pass. Every TTFT, TPOT, ITL and E2E meshbench
reports is computed here, from those stamps, in ms; every percentile too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence

import numpy as np

from meshbench.records.context import Slo
from meshbench.records.model import JsonObject, Percentiles, Timing


def percentile(values: Sequence[float], q: int) -> float | None:
    """The q-th percentile (numpy's linear interpolation); None when there are no values."""
    return float(np.percentile(np.asarray(values, dtype=np.float64), q)) if len(values) else None


def percentiles(values: Sequence[float], qs: Sequence[int] = (50, 95, 99), with_max: bool = False) -> JsonObject:
    """``p<q>`` for each q (numpy's linear interpolation), and ``max`` if asked; None for each when empty."""
    if not values:
        return {**{f"p{q}": None for q in qs}, **({"max": None} if with_max else {})}
    a = np.asarray(values, dtype=np.float64)
    return {**{f"p{q}": float(np.percentile(a, q)) for q in qs}, **({"max": float(a.max())} if with_max else {})}


# The stamps are nanoseconds (reported in ms: MS) or, for the tick clock's figures, ticks (unit 1).
MS = 1e6


def percentile_record(values: Sequence[float]) -> Percentiles:
    """p50, p95 and p99 as the record results.json holds."""
    return Percentiles(p50=percentile(values, 50), p95=percentile(values, 95), p99=percentile(values, 99))


def ttft_ms(token_ns: Sequence[int], start_ns: int, unit: float = MS) -> float:
    """Time to the first token from ``start_ns`` (the submit, or the admission)."""
    return (token_ns[0] - start_ns) / unit


def tpot_ms(token_ns: Sequence[int], unit: float = MS) -> float | None:
    """TPOT, vLLM's definition: the session's mean gap between its tokens after the first (None: one token)."""
    n = len(token_ns)
    return (token_ns[-1] - token_ns[0]) / unit / (n - 1) if n > 1 else None


def e2e_ms(token_ns: Sequence[int], start_ns: int, unit: float = MS) -> float:
    """From ``start_ns`` to the last token."""
    return (token_ns[-1] - start_ns) / unit


def itl_ms(token_ns: Sequence[int], unit: float = MS) -> list[float]:
    """Every gap between two consecutive tokens."""
    return [(b - a) / unit for a, b in zip(token_ns, token_ns[1:])]


class Stamped(Protocol):
    """The timing record every latency is computed from: a node's ``Timing``, an endpoint's completion."""

    @property
    def submit_ns(self) -> int: ...

    @property
    def token_ns(self) -> list[int]: ...


@dataclass(frozen=True, slots=True)
class Samples:
    """A pass's latency samples: one TTFT and E2E (and TPOT, from two tokens) per session with a token, and
    every ITL gap."""

    ttft: list[float]
    tpot: list[float]
    itl: list[float]
    e2e: list[float]


def samples(stamps: Sequence[Stamped], starts: Sequence[int] | None = None) -> Samples:
    """The latency samples of ``stamps``, TTFT and E2E measured from each one's submit, or from ``starts`` (one
    per stamp: the admission, the moment a slot took the session)."""
    begin = [s.submit_ns for s in stamps] if starts is None else list(starts)
    timed = [(s.token_ns, b) for s, b in zip(stamps, begin) if s.token_ns]
    tpot = [tpot_ms(t) for t, _ in timed]
    return Samples(
        ttft=[ttft_ms(t, b) for t, b in timed],
        tpot=[x for x in tpot if x is not None],
        itl=[gap for t, _ in timed for gap in itl_ms(t)],
        e2e=[e2e_ms(t, b) for t, b in timed],
    )


def queue_ms(timing: Sequence[Timing]) -> list[float]:
    """Each admitted session's wait from its submit to its slot."""
    return [(t.admit_ns - t.submit_ns) / MS for t in timing if t.admit_ns is not None]


def within_slo(token_ns: Sequence[int], start_ns: int, slo: Slo, unit: float = MS) -> bool:
    """TTFT and TPOT within the SLO's limits (in ``unit``; a limit of None holds)."""
    return slo.meets(ttft_ms(token_ns, start_ns, unit), tpot_ms(token_ns, unit))
