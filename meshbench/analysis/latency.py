"""Latency figures from one timing record, the same for a node's sessions and an endpoint's completions.

A timed session is a submit stamp, an admission stamp (None until a slot took it) and one stamp per token
received, in monotonic nanoseconds from the start of its pass. Every TTFT, TPOT, ITL and E2E meshbench
reports is computed here, from those stamps, in ms; every percentile too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from meshbench.records import JsonObject


def percentiles(values: Sequence[float], qs: Sequence[int] = (50, 95, 99), with_max: bool = False) -> JsonObject:
    """``p<q>`` for each q (numpy's linear interpolation), and ``max`` if asked; None for each when empty."""
    if not values:
        return {**{f"p{q}": None for q in qs}, **({"max": None} if with_max else {})}
    a = np.asarray(values, dtype=np.float64)
    return {**{f"p{q}": float(np.percentile(a, q)) for q in qs}, **({"max": float(a.max())} if with_max else {})}


# The stamps are nanoseconds (reported in ms: MS) or, for the tick clock's figures, ticks (unit 1).
MS = 1e6


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


@dataclass(frozen=True, slots=True)
class Samples:
    """A pass's latency samples: one TTFT, E2E (and TPOT, from two tokens) per session with a token, every ITL
    gap, and one queue wait per admitted session."""

    ttft: list[float]
    tpot: list[float]
    itl: list[float]
    e2e: list[float]
    queue: list[float]


def samples(stamps: Sequence[Mapping[str, Any]], since: str = "submit_ns") -> Samples:
    """The latency samples of ``stamps`` (timing records), TTFT and E2E measured from ``since`` (``submit_ns``,
    or ``admit_ns``: from the moment a slot took the session)."""
    timed = [s for s in stamps if s["token_ns"]]
    tpot = [tpot_ms(s["token_ns"]) for s in timed]
    return Samples(
        ttft=[ttft_ms(s["token_ns"], s[since]) for s in timed],
        tpot=[t for t in tpot if t is not None],
        itl=[gap for s in timed for gap in itl_ms(s["token_ns"])],
        e2e=[e2e_ms(s["token_ns"], s[since]) for s in timed],
        queue=[(s["admit_ns"] - s["submit_ns"]) / 1e6 for s in stamps if s.get("admit_ns") is not None],
    )


def within_slo(token_ns: Sequence[int], start_ns: int, slo: Mapping[str, Any], unit: float = MS) -> bool:
    """TTFT and TPOT within the SLO's limits (in ``unit``; a limit of None holds)."""
    return meets(slo, ttft_ms(token_ns, start_ns, unit), tpot_ms(token_ns, unit))


def meets(slo: Mapping[str, Any], ttft: float, tpot: float | None) -> bool:
    """A session's TTFT and TPOT (None: one token) within the SLO's limits (a limit of None holds)."""
    return (slo.get("ttft") is None or ttft <= slo["ttft"]) and (
        slo.get("tpot") is None or tpot is None or tpot <= slo["tpot"]
    )
