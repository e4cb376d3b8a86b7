"""Summaries of repeated measurements, and whether two sets of them differ.

The confidence interval of the median is distribution-free, from order statistics: the
k-th smallest and k-th largest of n samples bracket the median with probability
1 - 2 * P(Binomial(n, 1/2) < k). We take the largest k whose coverage is still at least
95%; with n = 5 even the widest interval (min, max) covers only 93.75%, and we say so
(``ci_level``) rather than pretend. Two sets differ when a two-sided Mann-Whitney U test
says p < 0.01 (exact for small samples without ties): with 5 and 5 repetitions only a
complete separation reaches it (p = 0.0079).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
from scipy import stats as sps  # type: ignore[import-untyped]

from meshbench.records import JsonObject
from meshbench.records.model import Summary

MIN_STRONG = 5  # repetitions on each side before a performance verdict is more than weak
ALPHA = 0.01
CI_TARGET = 0.95


def summary(values: Sequence[float]) -> Summary:
    """Median, min, max and (n >= 5) the order-statistics confidence interval of the median."""
    a = np.sort(np.asarray(values, dtype=np.float64))  # (n,)
    n = int(a.size)
    low = high = level = None
    if n >= MIN_STRONG:
        k, level = median_ci_rank(n)
        low, high = float(a[k - 1]), float(a[n - k])
    return Summary(
        n=n, median=float(np.median(a)), min=float(a[0]), max=float(a[-1]), ci_low=low, ci_high=high, ci_level=level
    )


def median_ci_rank(n: int) -> tuple[int, float]:
    """The rank k (1-based) of the interval (x_(k), x_(n-k+1)) and its exact coverage.

    The largest k with coverage >= 95%; when even k = 1 falls short (n <= 5), k = 1.
    """
    best = (1, 1.0 - 2.0 * float(sps.binom.cdf(0, n, 0.5)))
    for k in range(2, n // 2 + 1):
        level = 1.0 - 2.0 * float(sps.binom.cdf(k - 1, n, 0.5))
        if level < CI_TARGET:
            break
        best = (k, level)
    return best


def rank_test_p(a: Sequence[float], b: Sequence[float]) -> float:
    """Two-sided Mann-Whitney U p-value; 1.0 when every value is the same."""
    if len(set(a) | set(b)) == 1:
        return 1.0
    return float(sps.mannwhitneyu(a, b, alternative="two-sided", method="auto").pvalue)


@dataclass(frozen=True, slots=True)
class Verdict:
    verdict: str  # "improved", "unchanged", "regressed"
    strong: bool  # both sides have >= 5 repetitions
    change: float  # candidate median / baseline median - 1
    p_value: float | None
    reason: str

    def to_dict(self) -> JsonObject:
        return {
            "verdict": self.verdict,
            "strong": self.strong,
            "change": self.change,
            "p_value": self.p_value,
            "reason": self.reason,
        }


def judge(baseline: Sequence[float], candidate: Sequence[float], higher_is_better: bool, tolerance: float) -> Verdict:
    """A change counts only when it exceeds ``tolerance`` AND the samples tell the two runs apart."""
    base, cand = float(np.median(baseline)), float(np.median(candidate))
    # Relative change; from a zero baseline any change counts as +-100% (JSON has no infinity).
    change = cand / base - 1.0 if base else float(np.sign(cand - base))
    strong = min(len(baseline), len(candidate)) >= MIN_STRONG
    better = change > 0 if higher_is_better else change < 0
    direction = "improved" if better else "regressed"
    if abs(change) <= tolerance:
        return Verdict("unchanged", strong, change, None, f"within the {tolerance:.0%} tolerance")
    if not strong:
        return Verdict(
            direction,
            False,
            change,
            None,
            f"beyond the {tolerance:.0%} tolerance, but fewer than {MIN_STRONG} repetitions on a side: "
            "a weak verdict that does not gate",
        )
    p = rank_test_p(baseline, candidate)
    if p < ALPHA:
        return Verdict(direction, True, change, p, f"beyond the tolerance and the rank test says p = {p:.4f}")
    return Verdict(
        "unchanged", True, change, p, f"beyond the tolerance, but the spread cannot tell the runs apart (p = {p:.4f})"
    )
