"""Where a sampled token fell among its candidates, and whether a sampled divergence can be the server's
numerics: the sampled counterpart of a greedy near-tie (meshbench.analysis.endpoint_margins).

llama.cpp draws a token by walking its candidates in order (after the samplers; top-k sorts them, best first, and
meshbench pins top-k under sampling, meshbench.workload.request) and taking the first whose cumulative probability
passes one uniform draw from the request's seeded generator; a token left with a single candidate draws nothing.
So two answers to one session with one seed make the same draws, token for token, while their tokens agree and
no token had a single candidate in one answer and more in the other. Where they first differ, the draw was the
same; only the candidates' probabilities can have moved, past it:

- with both answers' candidates (the margin passes: cold against warm, all at once, after a sibling), one draw
  gives both tokens only if their intervals of cumulative probability overlap. Apart: ``confident``, whatever
  the numerics: no single draw gives both, so the draw itself was another (another random stream, or another
  count of draws before it). Overlapping, with no candidate's probability moved by more than the server's
  measured numerics (the largest such move where answers agree, ``numerics``, never above CAP): a ``near-tie``,
  the draw fell where the arithmetic moved a boundary (two candidates of nearly equal probability that swap
  places move a boundary far on a small change). Overlapping, but moved by more: ``confident`` too, the
  probabilities moved more than arithmetic moves them. Within the reported probabilities' rounding of touching:
  ``unknown``.
- with the cold answer's only (a timed pass asks for no probabilities), the probability between the two tokens
  in the cold order is the least the boundary had to move. More than the numerics: ``confident``. Else
  ``unknown``: a neighbouring token is what another draw gives as often as numerics do, so the cold order alone
  cannot tell them apart.

``unknown`` too where a token is not listed, or where a token before the divergence had a single candidate (the
draw count may differ)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from meshbench.records.completion import Completion
from meshbench.records.margins import MarginPasses

CAP = 0.2  # the most a candidate's probability is taken to move by arithmetic alone
TAIL = 3.0  # the measured numerics are at most this many times the 99th percentile of the moves (as margins')
WHOLE = 1 - 1e-3  # candidates listing this much probability are all there were: an unlisted token had none
SUM_SLACK = 1e-3  # a token's candidates' probabilities add up to at most 1, rounding aside
ROUNDING = 1e-6  # the reported probabilities' rounding: intervals closer than this to touching are not told apart


def sampled(a: Completion) -> bool:
    """Does the answer record its candidates (a sampled margin pass over the native API)?"""
    return a.candidates is not None and a.candidate_probs is not None


def interval(ids: Sequence[int], probs: Sequence[float], token: int) -> tuple[float, float] | None:
    """The token's interval of cumulative probability in the draw's order (None: not listed)."""
    if token not in ids:
        return None
    r = list(ids).index(token)
    lo = math.fsum(probs[:r])
    return lo, lo + probs[r]


def gap(a: Completion, k: int, other: int) -> float | None:
    """The least the cold answer ``a``'s candidates at token ``k`` must have moved for one draw to give ``other``:
    the probability between the two tokens in the cold order; an unlisted ``other`` (where the list is whole: it
    had none) lies after every listed one (None: unknown)."""
    if not sampled(a) or k >= len(a.candidates or []):
        return None
    ids, probs = (a.candidates or [])[k], (a.candidate_probs or [])[k]
    if a.tokens[k] not in ids:
        return None
    i = list(ids).index(a.tokens[k])
    if other not in ids:
        return round(math.fsum(probs[i + 1 :]), 6) if math.fsum(probs) >= WHOLE else None
    lo, hi = sorted((i, list(ids).index(other)))
    return round(math.fsum(probs[lo + 1 : hi]), 6)


def overlap(a: Completion, x: Completion, k: int) -> float | None:
    """How far the intervals of ``a``'s and ``x``'s tokens ``k`` overlap, each in its own answer's candidates
    (negative: how far apart they lie; None: a token not listed, or an answer without candidates)."""
    ends = [_at(y, k) for y in (a, x)]
    if ends[0] is None or ends[1] is None:
        return None
    (lo_a, hi_a), (lo_x, hi_x) = ends[0], ends[1]
    return round(min(hi_a, hi_x) - max(lo_a, lo_x), 9)


def _at(y: Completion, k: int) -> tuple[float, float] | None:
    if not sampled(y) or k >= len(y.candidates or []) or k >= len(y.tokens):
        return None
    return interval((y.candidates or [])[k], (y.candidate_probs or [])[k], y.tokens[k])


def _singles(y: Completion, k: int) -> list[bool]:
    """Before token ``k``, which tokens had a single candidate (drew nothing)."""
    return [len(ids) == 1 for ids in (y.candidates or [])[:k]]


def shift(a: Completion, x: Completion, k: int) -> float | None:
    """How far the candidates' probabilities moved from ``a``'s to ``x``'s at token ``k``: the largest change of one
    candidate's probability (one listed in only one of them had none in the other; None: either lists none)."""
    if not sampled(a) or not sampled(x) or k >= len(a.candidates or []) or k >= len(x.candidates or []):
        return None
    one = dict(zip((a.candidates or [])[k], (a.candidate_probs or [])[k]))
    two = dict(zip((x.candidates or [])[k], (x.candidate_probs or [])[k]))
    return round(max(abs(one.get(t, 0.0) - two.get(t, 0.0)) for t in {*one, *two}), 6) if one or two else None


def moves(passes: MarginPasses) -> list[float]:
    """Each ``shift`` between a session's cold answer and its warm, batched or after-sibling one, over the tokens
    where the two agree (the same draw, the same token): the server's arithmetic, measured."""
    cold = {c.session_id: c for c in passes.cold if c.error is None and sampled(c)}
    out: list[float] = []
    for t in [*passes.warm, *passes.together, *(passes.sibling or [])]:
        a = cold.get(t.session_id)
        if a is None or t.error is not None or not sampled(t):
            continue
        shared = min(len(a.tokens), len(t.tokens))
        agree = next((i for i in range(shared) if a.tokens[i] != t.tokens[i]), shared)
        out += [m for k in range(agree) if (m := shift(a, t, k)) is not None]
    return out


def numerics(passes: MarginPasses) -> float | None:
    """The largest move where the answers agree, but at most TAIL times their 99th percentile (None: none)."""
    found = sorted(moves(passes))
    if not found:
        return None
    p99 = found[math.ceil(0.99 * len(found)) - 1]
    return round(min(found[-1], TAIL * p99), 6)


def threshold(passes: MarginPasses | None) -> float:
    """How far a boundary may have moved by arithmetic alone: the measured numerics, never above CAP (0
    unmeasured)."""
    measured = None if passes is None else numerics(passes)
    return min(CAP, measured or 0.0)


@dataclass(frozen=True, slots=True)
class Placed:
    """Where a sampled divergence's draw fell: ``overlap`` of the two tokens' intervals (negative: apart; the cold
    order alone: minus the probability between them), how far the candidates' probabilities ``moved`` (``shift``;
    both answers' candidates only), and the kind (module docstring)."""

    overlap: float | None
    moved: float | None
    kind: str


def classify(a: Completion, x: Completion, k: int, limit: float) -> Placed:
    """A sampled divergence at token ``k`` of ``x`` from the cold answer ``a`` (module docstring)."""
    unknown = Placed(None, None, "unknown")
    if not sampled(a) or k >= len(x.tokens):
        return unknown
    if sampled(x):
        if _singles(a, k) != _singles(x, k):
            return unknown  # (one drew nothing where the other drew: their later draws differ anyway)
        shared, move = overlap(a, x, k), shift(a, x, k)
        if shared is None or abs(shared) <= ROUNDING:
            return unknown
        if shared < 0:
            return Placed(round(shared, 6), move, "confident")  # (no single draw gives both)
        if move is None:
            return Placed(round(shared, 6), None, "unknown")
        return Placed(round(shared, 6), move, "near-tie" if move <= max(limit, ROUNDING) else "confident")
    if any(len(ids) <= 2 for ids in (a.candidates or [])[:k]):
        return unknown  # (the other answer may have had a single candidate there: unseen)
    between = gap(a, k, x.tokens[k])
    if between is None:
        return unknown
    return Placed(-between, None, "confident" if between > limit else "unknown")
