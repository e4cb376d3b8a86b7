"""The README section of a sampled endpoint bundle's divergences, classified by where each draw fell
(meshbench.analysis.draws) rather than by a margin."""

from __future__ import annotations

from meshbench.analysis import draws
from meshbench.records.margins import Divergence
from meshbench.results.endpoint_proofs_report import confident_lines, kinds
from meshbench.results.typed import EndpointBundle


def section(b: EndpointBundle) -> list[str]:
    d = b.results.divergences
    assert d is not None and d.by_draw  # (the caller's: a bundle classified by the draw)
    measured = "no agreeing token to measure it on" if d.numerics is None else f"{d.numerics:.3g}"
    rows = [
        f"| {c} | {x.answers} | {x.differing} | {x.near_ties} | {x.confident} | {x.unknown} |"
        for c, x in d.levels.items()
    ]
    lines = [
        "## Divergences, by where each draw fell",
        "",
        "Every session was also sent with each token's candidates after the samplers (every one top-k leaves, with "
        "their probabilities), outside the timed passes: alone and cold, alone and warm, and with every session at "
        "once. With one seed per session an honest llama.cpp makes the same draws for a session, token for token, "
        "while its tokens agree (and no token had a single candidate, which draws nothing, in one answer and more "
        "in the other); where two answers first differ, only the candidates' probabilities can have moved, past the "
        "draw. Each answer is placed against its session's cold answer. Where both list candidates (the margin "
        "passes), one draw gives both tokens only if their intervals of cumulative probability overlap. Apart is "
        "confident, whatever the numerics: no single draw gives both, so the draw itself was another (another "
        "random stream, or another count of draws before it). Overlapping, with no candidate's probability moved by "
        f"more than {d.threshold:.3g} (the numerics: where a warm or batched answer agrees with the cold one, a "
        f"candidate's probability moved by at most {measured}; never above {draws.CAP:g}) is a near-tie, the draw "
        "fell at a boundary the arithmetic moved; moved by more is confident, the probabilities moved more than "
        "arithmetic moves them. Where only the cold answer lists them (the timed passes), more probability between "
        "the two tokens in the cold order than the numerics is confident; less is unknown, since another draw "
        "lands on a neighbouring token as readily as numerics move one. Unknown too: a token not listed, an "
        "earlier token with one or two candidates (the draw count may differ), intervals within rounding of "
        "touching. "
        f"All at once, {len(d.together_differing)} sessions differ from their cold answer "
        f"({kinds(d.together_differing)}); warm, {len(d.warm_differing)} ({kinds(d.warm_differing)}).",
        "",
        "| C | answers | differ from cold | near-ties | confident | unknown |",
        "|---|---|---|---|---|---|",
        *rows,
        "",
    ]
    return lines + confident_lines(d.confident, _why)


def _why(x: Divergence) -> str:
    if x.overlap is not None and x.overlap < 0:
        return (f"another draw (the intervals {-x.overlap:.3g} apart)" if x.moved is not None
                else f"{-x.overlap:.3g} of probability between the tokens in the cold order")  # fmt: skip
    return f"moved {x.moved:.3g}, more than the numerics" if x.moved is not None else "unknown"
