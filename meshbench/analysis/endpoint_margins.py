"""Why an endpoint's output changed with the load: a near-tie the server's own numerics can flip, or a confident
divergence that numerics do not explain (a suspected leak).

Each session is sent with the server's top-2 log-probabilities (its margin per token: top-1 minus top-2): alone
and cold (nothing taken from the prompt cache), alone and warm (right after itself, the prompt cache as the sweep
uses it), with every session at once, and, where a session's prompt starts like an earlier one's (a shared system
prompt), right after that sibling, whose KV the server's prompt cache may serve the shared part from
(meshbench.records.margins.MarginPasses). Where a warm or batched answer
agrees with the cold one token for token, the change in each margin is what the cache or batching alone did to
the server's arithmetic: the largest such change, held to TAIL times their 99th percentile so that a few
misreported margins cannot set it, is the server's measured numerics (``numerics``). Every answer of the sweep is
compared with its session's cold answer; where it first differs, the cold answer's margin says how close the
choice was:
- at most ``threshold`` (the measured numerics, never below ``FLOOR``, the node's own near-tie, and never above
  ``CAP``, whatever the server reports): a near-tie, classified as numerics;
- above it: confident. Batch-shape numerics do not flip a choice they cannot move that far, so the bundle names
  the sessions that were in flight beside it: a suspected leak, to be settled by perturbation and canaries;
- unknown where the alone answer gives no margin there (it ended first, or a margin was not finite).
A near-tie must also flip to the cold answer's second choice where the server named it by id (``runner_up``): a
change to any other token within the threshold is unknown (a third choice, whose margin only the top-2 asked for
cannot tell: an honest server's 3-way near-ties do this), never a near-tie, so a server that reports every margin
small cannot excuse a leak that writes another token: it is left unjudged, and a proof resting on it does not
pass.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

from meshbench.analysis import draws
from meshbench.analysis.figures import NEAR_TIE
from meshbench.engine import apis
from meshbench.records.margins import Divergence, Divergences, LevelDivergences, MarginPasses
from meshbench.records.model import Completion, EndpointLevel

FLOOR = NEAR_TIE  # (the node's near-tie, in the same unit: a logit difference is a log-probability difference)
# A near-tie is never a choice of margin above CAP: a factor e^2 (7.4) between the top two probabilities, which no
# difference in arithmetic between two runs of one request moves (llama-server's largest on Gemma 3 270M in the
# committed bundles: 0.92). A server whose margins move more where its answers agree is said to be inconsistent.
CAP = 2.0
TAIL = 3.0  # the measured numerics are at most this many times the 99th percentile of the margin changes
SHARED_MIN = 16  # a common start of this many ids is a shared prefix (a system prompt), not a shared BOS or template


def siblings(ids: Sequence[str], prompt_ids: Sequence[Sequence[int]]) -> dict[str, str]:
    """Each session whose prompt starts with at least SHARED_MIN of an earlier session's ids (a shared system
    prompt) -> the earlier session sharing the most, the latest of equals: what a prompt cache could serve it from.
    One pass over a trie of the prompts (each node: the latest session whose prompt runs through it), so the cost
    is the prompts' total length, however many sessions share."""
    root = _Node()
    out: dict[str, str] = {}
    for sid, prompt in zip(ids, prompt_ids):
        node, depth = root, 0
        for t in prompt:  # the deepest node an earlier prompt reached: the longest shared start
            if t not in node.children:
                break
            node, depth = node.children[t], depth + 1
        if depth >= SHARED_MIN:
            out[sid] = node.latest
        node = root
        for t in prompt:
            node = node.children.setdefault(t, _Node())
            node.latest = sid
    return out


class _Node:
    """A trie node: the next ids, and the latest session whose prompt runs through it."""

    __slots__ = ("children", "latest")

    def __init__(self) -> None:
        self.children: dict[int, _Node] = {}
        self.latest = ""


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading ids two prompts share."""
    k = first_difference(a, b)
    return min(len(a), len(b)) if k is None else k


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    """The first index where two token lists differ (the shorter's length where one is the other's start)."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def token_difference(a: Completion, x: Completion) -> int | None:
    """Where ``x`` first leaves ``a`` (an answer with margins), as a token index of ``a``: by id where either has
    ids; else (an OpenAI API's text) by byte. Where both give their tokens' lengths in bytes (the margin passes),
    the first token whose bytes or boundary differ. Where only ``a`` does (a timed answer: text alone), the token of
    ``a`` holding the first differing byte; a byte at a token's start could be the one before it extended (" the"
    against " they"), so of those two the one with the smaller margin, the choice more easily flipped. Where ``a``
    gives no lengths, past its margins: unknown."""
    if a.tokens or x.tokens:
        return first_difference(a.tokens, x.tokens)
    ab, xb = a.text.encode("utf-8", "surrogatepass"), x.text.encode("utf-8", "surrogatepass")
    k = first_difference(ab, xb)
    if k is None:
        return None
    if a.token_bytes is None:
        return len(a.margins or [])
    starts = [0]
    for n in a.token_bytes:
        starts.append(starts[-1] + n)
    if x.token_bytes is not None:
        at = 0
        for j, (n, m) in enumerate(zip(a.token_bytes, x.token_bytes)):
            if n != m or ab[at : at + n] != xb[at : at + n]:
                return j
            at += n
        return min(len(a.token_bytes), len(x.token_bytes))
    i = next((j for j in range(len(a.token_bytes)) if k < starts[j + 1]), len(a.token_bytes))
    if i == 0 or k != starts[i]:
        return i
    margins = a.margins or []
    known = [j for j in (i - 1, i) if j < len(margins) and margins[j] is not None]
    return min(known, key=lambda j: margins[j] or 0.0) if known else i


def text_tokens_whole(text: str, token_bytes: list[int], predicted: int | None) -> str | None:
    """Why a text answer's tokens (their lengths in bytes, one per margin) are not its text's (None: they are): one
    per token the server says it generated, adding up to the text's bytes (unless the text holds U+FFFD, where the
    server replaced a byte that is no UTF-8)."""
    if predicted is not None and len(token_bytes) != predicted:
        return f"log-probabilities for {len(token_bytes)} tokens; the server says it generated {predicted}"
    size = len(text.encode("utf-8", "surrogatepass"))
    if "\ufffd" not in text and sum(token_bytes) != size:
        return f"the tokens' lengths add up to {sum(token_bytes)} bytes; the text has {size}"
    return None


def compares(api: str, compared: str, temperature: float = 0.0, passes: MarginPasses | None = None) -> bool:
    """Are an endpoint's divergences classified? Under greedy decoding, where token ids are compared, or text over
    an OpenAI API, whose margin passes record each token's bytes (a native answer compared by text held back ids:
    it is not placed). Sampled, only by the draw (meshbench.analysis.draws: a drawn token's margin explains
    nothing): token ids compared, and cold answers that list their candidates."""
    if temperature:
        return compared == "tokens" and passes is not None and any(draws.sampled(c) for c in passes.cold)
    return compared == "tokens" or not apis.recorded(api).ids


def margin_changes(passes: MarginPasses) -> list[float]:
    """Each change in a margin between a session's cold answer and its warm, batched or after-sibling one, over the
    tokens where the two agree and so saw the same context."""
    cold = {c.session_id: c for c in passes.cold if c.error is None and c.margins is not None}
    out: list[float] = []
    for t in [*passes.warm, *passes.together, *(passes.sibling or [])]:
        a = cold.get(t.session_id)
        if a is None or a.margins is None or t.error is not None or t.margins is None:
            continue
        k = token_difference(a, t)
        agree = min(len(a.margins), len(t.margins)) if k is None else k
        out += [abs(x - y) for x, y in zip(a.margins[:agree], t.margins[:agree]) if x is not None and y is not None]
    return out


def numerics(passes: MarginPasses) -> float | None:
    """The server's measured numerics: the largest margin change where the answers agree (``margin_changes``), but
    at most TAIL times their 99th percentile, so that a few tokens whose margins the server misreports cannot set
    the threshold of the whole run (None: no such token). On honest runs the two agree: llama-server's largest
    change on Gemma 3 270M was 1.4 to 2.4 times its 99th percentile in the committed bundles."""
    changes = sorted(margin_changes(passes))
    if not changes:
        return None
    p99 = changes[math.ceil(0.99 * len(changes)) - 1]  # (nearest rank)
    return round(min(changes[-1], TAIL * p99), 6)


def inconsistent(passes: MarginPasses | None) -> str | None:
    """Why the server's margins cannot be its arithmetic's (None: they can): where its answers agree token for
    token, a margin moved by more than CAP, the bound a near-tie is held to (the largest change, whether or not
    the TAIL rule set it aside)."""
    changes = [] if passes is None else margin_changes(passes)
    if not changes or max(changes) <= CAP:
        return None
    return (
        f"where its answers agree token for token, the server's margins moved by up to {max(changes):.3g}, more "
        f"than any difference in arithmetic moves a margin: a near-tie is held to {near_tie(passes):.3g}"
    )


def caveats(passes: MarginPasses | None) -> str:
    """What the measured numerics rest on, where it is less than the whole (empty: nothing to say): changes the
    TAIL rule set aside, and a count of tokens too small for a 99th percentile to leave out the largest."""
    changes = [] if passes is None else sorted(margin_changes(passes))
    measured = numerics(passes) if passes is not None else None
    if not changes or measured is None:
        return ""
    out = []
    aside = [x for x in changes if round(x, 6) > measured]  # (numerics is rounded to 6 places)
    if aside:
        out.append(
            f"{len(aside)} larger changes, up to {aside[-1]:.3g}, were set aside (more than {TAIL:g} times the 99th "
            "percentile of the changes: a few misreported margins cannot set the threshold)"
        )
    if len(changes) < 100:
        out.append(
            f"measured on {len(changes)} tokens only, too few for a 99th percentile to leave out the largest: a "
            "few misreported margins could set it"
        )
    return "; ".join(out)


def cold_answers(passes: MarginPasses | None) -> dict[str, Completion]:
    """Each session's cold answer from the margin passes (none without them)."""
    return {} if passes is None else {x.session_id: x for x in passes.cold if x.error is None}


def near_tie(passes: MarginPasses | None) -> float:
    """The threshold of a near-tie: the measured numerics, never below FLOOR (FLOOR without margin passes) and never
    above CAP, whatever margins the server reports."""
    measured = None if passes is None else numerics(passes)
    return min(CAP, max(FLOOR, measured or 0.0))


def divergences(levels: Sequence[EndpointLevel], passes: MarginPasses, needle_of: str) -> Divergences:
    """Every answer of the sweep against its session's cold answer, classified by the margin where it differs;
    and the warm answers against the cold."""
    by_draw = any(draws.sampled(c) for c in passes.cold)
    measured = draws.numerics(passes) if by_draw else numerics(passes)
    threshold = draws.threshold(passes) if by_draw else near_tie(passes)
    cold = {c.session_id: c for c in passes.cold if c.error is None}
    warm = _against_cold(passes.warm, cold, 1, threshold, False, by_draw)
    together = _against_cold(passes.together, cold, len(passes.together), threshold, True, by_draw)
    sibling = None
    if passes.sibling is not None:  # (beside each: the sibling sent right before it)
        after = passes.siblings or {}
        found_after = _against_cold(passes.sibling, cold, 1, threshold, False, by_draw)
        sibling = [
            dataclasses.replace(d, beside=[after[d.session_id]] if d.session_id in after else []) for d in found_after
        ]
    per_level: dict[int, LevelDivergences] = {}
    found: list[Divergence] = []
    for lv in levels:
        answers = [
            (rep.repetition, x, overlapping(x, rep.sessions)) for rep in lv.repetitions for x in rep.sessions
        ] + [(None, t.completion, sorted(t.neighbours)) for t in lv.needle]
        here = []
        compared = unjudged = 0
        for repetition, x, beside in answers:
            sid = needle_of if x.session_id == "needle" else x.session_id
            if x.error is None and sid not in cold:
                unjudged += 1  # (nothing to judge it by: counted, never a pass)
            if x.error is not None or sid not in cold:
                continue
            compared += 1
            d = divergence(lv.concurrency, repetition, sid, x, cold[sid], beside, threshold, by_draw)
            if d is not None:
                here.append(d)
        kinds = [d.kind for d in here]
        per_level[lv.concurrency] = LevelDivergences(
            answers=compared,
            differing=len(here),
            near_ties=kinds.count("near-tie"),
            confident=kinds.count("confident"),
            unknown=kinds.count("unknown"),
            unjudged=unjudged or None,
        )
        found += here
    return Divergences(
        numerics=measured,
        warm_differing=warm,
        together_differing=together,
        threshold=round(threshold, 6),
        floor=0.0 if by_draw else FLOOR,
        by_draw=by_draw or None,
        levels=per_level,
        confident=[d for d in found if d.kind == "confident"],
        near_ties=[d for d in found if d.kind == "near-tie"],
        sibling_differing=sibling,
    )


def _against_cold(
    answers: Sequence[Completion], cold: dict[str, Completion], c: int, threshold: float, beside: bool, by_draw: bool
) -> list[Divergence]:
    """A margin pass's answers that differ from their cold ones (``beside``: every other session was in flight)."""
    out = []
    for x in answers:
        if x.error is None and x.session_id in cold:
            others = sorted(y.session_id for y in answers if y.session_id != x.session_id) if beside else []
            d = divergence(c, None, x.session_id, x, cold[x.session_id], others, threshold, by_draw)
            if d is not None:
                out.append(d)
    return out


def divergence(
    c: int,
    repetition: int | None,
    sid: str,
    x: Completion,
    a: Completion,
    beside: list[str],
    threshold: float,
    by_draw: bool = False,
) -> Divergence | None:
    """``x`` against its cold answer ``a``: where it first differs and its kind, by the cold margin there, or (a
    sampled sweep, ``by_draw``) by where the draw fell (meshbench.analysis.draws; ``threshold`` then in cumulative
    probability)."""
    k = token_difference(a, x)
    if k is None:
        return None
    margin = a.margins[k] if a.margins is not None and k < len(a.margins) else None
    placed = None
    if by_draw:  # (sampled: by where the draw fell, never by a margin)
        placed = draws.classify(a, x, k, threshold)
        kind = placed.kind
    else:
        kind = "unknown" if margin is None else "near-tie" if margin <= threshold else "confident"
        if kind == "near-tie" and not to_runner_up(a, x, k):
            kind = "unknown"  # (to a third choice, whose margin was not asked for: neither proven close nor far)
    return Divergence(
        concurrency=c,
        repetition=repetition,
        session_id=sid,
        token_index=k,
        margin=margin,
        kind=kind,
        beside=beside,
        overlap=None if placed is None else placed.overlap,
        moved=None if placed is None else placed.moved,
    )


def to_runner_up(a: Completion, x: Completion, k: int) -> bool:
    """Could ``x``'s token ``k`` be ``a``'s near-tie flipped: it is ``a``'s second choice there, or that is not known
    (no ids: an OpenAI API's text; no runner-up recorded: an older bundle, or a server that gave none)?"""
    second = a.runner_up[k] if a.runner_up is not None and k < len(a.runner_up) else None
    return second is None or k >= len(x.tokens) or x.tokens[k] == second


def overlapping(x: Completion, sessions: Sequence[Completion]) -> list[str]:
    """The sessions whose requests were in flight while ``x``'s was (from submission to the last token)."""
    start, end = x.submit_ns, _end(x)
    overlap = [y for y in sessions if y.session_id != x.session_id and y.submit_ns < end and start < _end(y)]
    return sorted(y.session_id for y in overlap)


def _end(x: Completion) -> int:
    return x.token_ns[-1] if x.token_ns else x.submit_ns
