"""Where a sampled token fell among its candidates, and whether a sampled divergence can be the server's
numerics: the sampled counterpart of a greedy near-tie (meshbench.analysis.endpoint_margins).

llama.cpp draws a token by walking its candidates in order (after the samplers; its default chain sorts them, best
first, at top-k) and taking the first whose cumulative probability passes one uniform draw from the request's
seeded generator. Two answers to one session with one seed make the same draws, token for token, as long as their
tokens agree. Where they first differ, the draw was the same; only the candidates' probabilities can have moved.
So a token drawn at ``u`` in one answer and another token in the other need the boundary between the two to have
moved past ``u``:

- with both answers' candidates (the margin passes: cold against warm, all at once, after a sibling), the two
  tokens' intervals of cumulative probability must share a point, the draw: their distance apart (0 where they
  overlap) is what the server's arithmetic would have had to move;
- with the cold answer's only (a timed pass asks for no probabilities), the probability between the two tokens in
  the cold order is the least it had to move (0 where they are neighbours).

Either is held to the measured numerics: the largest move of a drawn token's interval between answers that agree
(``numerics``), never above CAP. Within it, the divergence is a ``near-tie`` (the draw fell at a boundary the
arithmetic moved); beyond it, ``confident``: no arithmetic moves a boundary so far, so the draw itself was another,
a generator that is not the request's own. ``unknown`` where a token is not among the listed candidates."""

from __future__ import annotations

import math
from collections.abc import Sequence

from meshbench.records.completion import Completion
from meshbench.records.margins import MarginPasses

CAP = 0.05  # the most a near-boundary draw is excused: a move in cumulative probability no arithmetic makes
TAIL = 3.0  # the measured numerics are at most this many times the 99th percentile of the moves (as margins')
WHOLE = 1 - 1e-3  # candidates listing this much probability are all there were: an unlisted token had none
SUM_SLACK = 1e-3  # a token's candidates' probabilities add up to at most 1, rounding aside


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
    the probability between the two tokens (1.0 where ``other`` had none; None: unknown)."""
    if not sampled(a) or k >= len(a.candidates or []):
        return None
    ids, probs = (a.candidates or [])[k], (a.candidate_probs or [])[k]
    if a.tokens[k] not in ids:
        return None
    if other not in ids:
        return 1.0 if math.fsum(probs) >= WHOLE else None
    i, j = sorted((list(ids).index(a.tokens[k]), list(ids).index(other)))
    return round(math.fsum(probs[i + 1 : j]), 6)


def apart(a: Completion, x: Completion, k: int) -> float | None:
    """How far apart the intervals of ``a``'s and ``x``'s tokens ``k`` lie, each in its own answer's candidates (0:
    they overlap, one draw gives both; None: a token not listed, or an answer without candidates)."""
    ends = [_at(y, k) for y in (a, x)]
    if ends[0] is None or ends[1] is None:
        return None
    (lo_a, hi_a), (lo_x, hi_x) = ends[0], ends[1]
    return round(max(0.0, max(lo_a, lo_x) - min(hi_a, hi_x)), 6)


def _at(y: Completion, k: int) -> tuple[float, float] | None:
    if not sampled(y) or k >= len(y.candidates or []) or k >= len(y.tokens):
        return None
    return interval((y.candidates or [])[k], (y.candidate_probs or [])[k], y.tokens[k])


def moves(passes: MarginPasses) -> list[float]:
    """Each move of a drawn token's interval between a session's cold answer and its warm, batched or
    after-sibling one, over the tokens where the two agree (the same draw, the same token)."""
    cold = {c.session_id: c for c in passes.cold if c.error is None and sampled(c)}
    out: list[float] = []
    for t in [*passes.warm, *passes.together, *(passes.sibling or [])]:
        a = cold.get(t.session_id)
        if a is None or t.error is not None or not sampled(t):
            continue
        shared = min(len(a.tokens), len(t.tokens))
        agree = next((i for i in range(shared) if a.tokens[i] != t.tokens[i]), shared)
        for k in range(agree):
            one, two = _at(a, k), _at(t, k)
            if one is not None and two is not None:
                out.append(max(abs(one[0] - two[0]), abs(one[1] - two[1])))
    return out


def numerics(passes: MarginPasses) -> float | None:
    """The largest move where the answers agree, but at most TAIL times their 99th percentile (None: none)."""
    found = sorted(moves(passes))
    if not found:
        return None
    p99 = found[math.ceil(0.99 * len(found)) - 1]
    return round(min(found[-1], TAIL * p99), 6)


def threshold(passes: MarginPasses | None) -> float:
    """How far a boundary may have moved by arithmetic: the measured numerics, never above CAP (0 unmeasured:
    only neighbours, or overlapping intervals, are then excused)."""
    measured = None if passes is None else numerics(passes)
    return min(CAP, measured or 0.0)


def classify(a: Completion, x: Completion, k: int, limit: float) -> tuple[float | None, str]:
    """The distance a sampled divergence at token ``k`` needed (``apart`` where both answers list candidates, else
    ``gap``) and its kind against ``limit``."""
    distance = apart(a, x, k) if sampled(x) else None
    if distance is None and k < len(x.tokens):
        distance = gap(a, k, x.tokens[k])
    if distance is None:
        return None, "unknown"
    return distance, "near-tie" if distance <= limit else "confident"
