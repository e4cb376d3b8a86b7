"""The sweep's verdicts, recomputed from its records by the sweep and by verify alike.

Three properties, each said separately:
- isolation (content independence): proven per level by perturbation (meshbench.analysis.isolation);
- batch invariance: every session's tokens byte-identical across levels (the seed's check);
- corruption_free: no session failed, and isolation holds at every level where it was run; where a
  level could not run it (wall clock, injected faults, or isolation off), batch invariance is the only
  evidence, as in the seed, and must hold too; with a prefix cache, no level's cache equivalence fails
  but by engine numerics.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from meshbench.analysis import figures, isolation, prefix
from meshbench.records.documents import FirstDivergence, SweepIsolation
from meshbench.records.model import IsolationVerdict, LevelRecord, Reference


@dataclass(slots=True)
class ConcurrencySweep:
    levels: list[LevelRecord]
    corruption_free: bool
    first_divergence: FirstDivergence | None
    batch_invariant: bool
    isolation: SweepIsolation  # how isolation was proven, at how many levels, and whether it holds
    saturation_concurrency: int | None  # None for a sweep of arrival rates
    reference_concurrency: int
    reference: Reference | None = None  # arrival sweeps: every session run alone
    saturation_rates: dict[int, float | None] | None = (
        None  # arrival sweeps: per concurrency, the first rate a full queue refused
    )


@dataclass(frozen=True, slots=True)
class SweepVerdicts:
    corruption_free: bool
    batch_invariant: bool
    first_divergence: FirstDivergence | None
    isolation: SweepIsolation


def sweep_verdicts(
    levels: Sequence[LevelRecord],
    reference: Reference | None,
    per_level: Sequence[IsolationVerdict],
    family: str,
) -> SweepVerdicts:
    """The sweep's verdicts from its levels and each level's isolation verdict (``isolation.verdict``), whose
    passes formed the separating family ``family`` (``isolation.FAMILIES``)."""
    divergence = figures.sweep_divergence(levels, reference)
    ran = [v for v in per_level if v.ran]
    every_level = len(ran) == len(per_level)
    isolated = all(v.holds for v in ran)
    unfinished = figures.unfinished_sessions(levels)
    cached = all(lv.cache_verdict is None or lv.cache_verdict.classification in prefix.HARMLESS for lv in levels)
    return SweepVerdicts(
        corruption_free=isolated and cached and unfinished == 0 and (every_level or divergence is None),
        batch_invariant=divergence is None,
        first_divergence=divergence,
        isolation=SweepIsolation(
            method=isolation.METHODS[family],
            levels_run=len(ran),
            every_level=every_level,
            holds=isolated if ran else None,
        ),
    )
