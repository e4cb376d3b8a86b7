"""llama-server's native ``completion_probabilities``, one entry per token: each token's margin (top-1 minus
top-2 log-probability) and second choice, and, where post-sampling probabilities were asked for
(``post_sampling_probs``, the sampled margin passes), the candidates the draw walked, in the server's order, with
their probabilities after the samplers (meshbench.analysis.draws places a sampled divergence by them)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from meshbench.analysis.draws import SUM_SLACK
from meshbench.endpoint.answer_shape import MAX_LOGPROB, MAX_MARGIN, Malformed, is_token

MAX_CANDIDATES = 64  # candidates recorded per token (results.json's bound)


@dataclass(frozen=True, slots=True)
class Probs:
    """One chunk's tokens' probabilities, as the answer records them."""

    margins: list[float | None]
    runner_up: list[int | None]
    candidates: list[list[int]] | None = None  # (post-sampling probabilities only)
    candidate_probs: list[list[float]] | None = None


def parse(probs: object, tokens: list[int]) -> Probs:
    """The probabilities of a chunk's ``tokens``: ``top_logprobs`` (log-probabilities before sampling) or
    ``top_probs`` (probabilities after the samplers), every entry alike."""
    if not isinstance(probs, list) or not all(isinstance(p, dict) for p in probs):
        raise Malformed("'completion_probabilities' is not a list of objects")
    if len(probs) != len(tokens):
        raise Malformed(f"{len(probs)} completion_probabilities for {len(tokens)} tokens in a chunk")
    post = bool(probs) and all("top_probs" in p for p in probs)
    ranked = [_post(p["top_probs"]) if post else _pre(p.get("top_logprobs")) for p in probs]
    margins = [_margin([lp for _, lp in r]) for r in ranked]
    seconds = [_runner_up(r, emitted) for r, emitted in zip(ranked, tokens)]
    if not post:
        return Probs(margins, seconds)
    ids = [[x["id"] for x in p["top_probs"]] for p in probs]
    values = [[float(x["prob"]) for x in p["top_probs"]] for p in probs]
    return Probs(margins, seconds, ids, values)


def margins(probs: list[dict]) -> list[float | None]:
    """Each entry's margin from its ``top_logprobs`` (the OpenAI APIs' log-probabilities, put in this shape)."""
    return [_margin([lp for _, lp in _pre(p.get("top_logprobs"))]) for p in probs]


def _pre(top: object) -> list[tuple[object, float]]:
    """(id, log-probability) per entry of ``top_logprobs``, best first."""
    if not isinstance(top, list) or not all(isinstance(x, dict) for x in top):
        raise Malformed("'top_logprobs' is not a list of objects (a llama-server older than its logprob API?)")
    lps = [x.get("logprob") for x in top]
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and -1e300 < v <= MAX_LOGPROB for v in lps):
        raise Malformed("a 'logprob' is not a number at most 0")
    return sorted(((x.get("id"), float(v)) for x, v in zip(top, lps)), key=lambda e: -e[1])  # type: ignore[arg-type]


def _post(top: object) -> list[tuple[object, float]]:
    """(id, log-probability) per candidate of ``top_probs`` with a probability above 0, best first; the candidates
    held to their shape: ids, each once, probabilities in [0, 1] adding up to at most 1."""
    if not isinstance(top, list) or not all(isinstance(x, dict) for x in top) or len(top) > MAX_CANDIDATES:
        raise Malformed(f"'top_probs' is not a list of at most {MAX_CANDIDATES} objects")
    ids, ps = [x.get("id") for x in top], [x.get("prob") for x in top]
    if not all(is_token(i) for i in ids) or len(set(ids)) != len(ids):
        raise Malformed("a candidate of 'top_probs' has no integer 'id', or one id is listed twice")
    if not all(isinstance(p, (int, float)) and not isinstance(p, bool) and 0 <= p <= 1 for p in ps):
        raise Malformed("a candidate's 'prob' is not a probability")
    if not ps or any(p < q for p, q in zip(ps, ps[1:])):  # type: ignore[operator]
        raise Malformed("'top_probs' is empty, or not sorted best first (as llama-server lists candidates)")
    if sum(ps) > 1 + SUM_SLACK:  # type: ignore[arg-type]
        raise Malformed(f"the candidates' probabilities add up to {sum(ps):.6g}, over 1")  # type: ignore[arg-type]
    found = [(i, math.log(p)) for i, p in zip(ids, ps) if p > 0]  # type: ignore[operator, arg-type]
    return sorted(found, key=lambda e: -e[1])


def _margin(lps: list[float]) -> float | None:
    """Top-1 minus top-2 log-probability (None where fewer than two are given)."""
    margin = round(lps[0] - lps[1], 6) if len(lps) >= 2 else None
    if margin is not None and margin > MAX_MARGIN:
        raise Malformed(f"a margin of {margin:g} between the top two log-probabilities (over {MAX_MARGIN})")
    return margin


def _runner_up(ranked: list[tuple[object, float]], emitted: int) -> int | None:
    """The token's second choice, by id: the best-ranked entry that is not the token emitted (with tied
    log-probabilities either order is the server's). llama-server gives every entry an id: an entry of the top two
    without an integer one is the answer's fault, never a runner-up unknown (which would let a near-tie excuse any
    flip)."""
    if len(ranked) < 2:
        return None  # (no margin either)
    if not all(is_token(i) for i, _ in ranked[:2]):
        raise Malformed("an entry of 'top_logprobs' has no integer 'id' (llama-server gives every entry one)")
    return next((i for i, _ in ranked if i != emitted), None)  # type: ignore[return-value]


def runner_ups(probs: list, tokens: list[int]) -> list[int | None]:
    """Each token's second choice from ``completion_probabilities`` (their shape checked first)."""
    return parse(probs, tokens).runner_up
