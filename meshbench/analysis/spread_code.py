"""Separating families with a margin: constant-weight codes in which every ordered pair is separated ``d`` times.

Isolation's passes (meshbench.analysis.isolation) give session k a subset S_k of the m passes (a codeword of m
bits, pass p perturbing every session whose word holds bit p). A dependence of session i on one bit of session
j's content is tested once by every pass in S_j \\ S_i, and escapes n such passes with probability 2^-n. The
smallest family that tests every ordered pair once (Sperner: subsets of size floor(m/2)) run ``d`` times over
tests every pair at least ``d`` times in ``d * m`` passes. A constant-weight code of weight w whose words meet
in at most w - d bits gives every pair |S_j \\ S_i| >= d in fewer: 16 sessions need 10 passes at d = 2 (not 12)
and 16 at d = 4 (not 24); 8 sessions at d = 4 need 14 (not 20).

The code is the greedy lexicode: the combinations of size floor(m/2) of range(m) in lexicographic order, each
kept when it meets every kept word in at most w - d bits, for the smallest m (above the once-through family's)
that yields one word per session. It is a fixed function of (n, d), so a bundle's passes are replayed from its
config. The search is bounded (SEARCH word comparisons in all, at most a quarter of a second here) and tried for
d <= MAX_ROUNDS only; where it finds no shorter family, the family run ``d`` times is the answer, so the code is
never longer than the rounds it replaces. It is shorter for up to 255 sessions at d = 2, 72 at d = 3 and 30 at
d = 4 (the default rounds); beyond, and from d = 5, the rounds are what it gives.
"""

from __future__ import annotations

import functools
import itertools
import math

SEARCH = 1 << 20  # word comparisons the search may make, over every m it tries
MAX_ROUNDS = 4  # from 5 on, the search finds a shorter code for a handful of sessions only, in seconds


def once(n: int) -> int:
    """The fewest passes m whose subsets of size floor(m/2) number at least ``n`` (0 for one session): the
    smallest family separating every ordered pair once."""
    if n <= 1:
        return 0
    m = 1
    while math.comb(m, m // 2) < n:
        m += 1
    return m


@functools.lru_cache(maxsize=256)
def lexicode(n: int, d: int) -> tuple[int, tuple[int, ...]] | None:
    """(m, the n codewords as bit masks over m passes) with every ordered pair of words separated by at least
    ``d`` passes, in fewer than ``d * once(n)`` passes; None where the bounded search finds none (one session,
    d = 1, d > MAX_ROUNDS, or no shorter code within SEARCH comparisons)."""
    base = once(n)
    if n <= 1 or d <= 1 or d > MAX_ROUNDS:
        return None
    budget = SEARCH
    for m in range(base + 1, d * base):
        w = m // 2
        if w < d or math.comb(m, w) < n:
            continue
        words: list[int] = []
        for combo in itertools.combinations(range(m), w):
            budget -= max(1, len(words))
            if budget < 0:
                return None
            word = sum(1 << p for p in combo)
            if all((word & kept).bit_count() <= w - d for kept in words):
                words.append(word)
                if len(words) == n:
                    return m, tuple(words)
    return None
