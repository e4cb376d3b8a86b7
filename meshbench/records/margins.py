"""The records of an endpoint's margins: each session's answer with the server's top-2 log-probabilities per
token (alone cold, alone warm, and with every session at once), and every output of the sweep that differs from
the session's cold answer, classified by the margin where it first differs (meshbench.analysis.endpoint_margins)."""

from __future__ import annotations

from dataclasses import dataclass

from meshbench.records.completion import Completion


@dataclass(frozen=True, slots=True, kw_only=True)
class MarginPasses:
    """Every session sent with top-2 log-probabilities, outside the timed passes (asking for them costs the
    server time): alone and cold (``cache_prompt`` false: nothing reused), at once again alone as the sweep sends
    it (``warm``: after itself, where the server's prompt cache keeps it), and all at once (``together``)."""

    cold: list[Completion]
    warm: list[Completion]
    together: list[Completion]
    # Each session whose prompt shares its start with an earlier one's, sent right after that sibling (as the sweep
    # sends both): where the server's prompt cache serves the shared part from the sibling's KV. ``siblings``:
    # each such session -> its sibling (meshbench.analysis.endpoint_margins.siblings). None in older bundles.
    sibling: list[Completion] | None = None
    siblings: dict[str, str] | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Divergence:
    """One answer that differs from its session's cold answer: where, the cold answer's margin there, and the
    sessions in flight beside it (their requests overlapped it in time)."""

    concurrency: int
    repetition: int | None  # None: a needle trial, or a margin pass
    session_id: str
    token_index: int
    margin: float | None  # top-1 minus top-2 log-probability of the cold answer at token_index (None: unknown)
    kind: str  # "near-tie" (margin within the server's own numerics), "confident", or "unknown"
    beside: list[str]
    overlap: float | None = None  # sampled, by the draw (meshbench.analysis.draws): how far the two tokens'
    # intervals of cumulative probability overlap (negative: apart; the cold order alone: minus the probability
    # between them); None: greedy, or unknown
    moved: float | None = None  # sampled, both answers' candidates: the largest move of one candidate's probability


@dataclass(frozen=True, slots=True, kw_only=True)
class LevelDivergences:
    answers: int  # answers compared at this level (every repetition, and the needle's trials)
    differing: int
    near_ties: int
    confident: int
    unknown: int
    unjudged: int | None = None  # answers with no cold answer to compare with (its margin pass failed or was
    # withheld); None: none (and bundles made before it was counted)


@dataclass(frozen=True, slots=True, kw_only=True)
class Divergences:
    """The sweep's answers against each session's cold answer, with the threshold that tells a near-tie."""

    numerics: float | None  # the largest margin change the warm or the batched answer showed where it agrees
    # with the cold one
    warm_differing: list[Divergence]  # sessions whose warm answer differs from their cold one
    together_differing: list[Divergence]  # sessions whose answer among all the others differs from their cold one
    threshold: float  # a divergence whose margin is at most this is a near-tie: max(numerics, floor)
    floor: float
    levels: dict[int, LevelDivergences]  # by concurrency
    confident: list[Divergence]  # every confident divergence, with its neighbours: suspected leaks
    near_ties: list[Divergence]
    sibling_differing: list[Divergence] | None = None  # answers right after a sibling that differ from cold (beside:
    # the sibling); None where there was no sibling pass
    by_draw: bool | None = None  # sampled: classified by the draw, not the margin (meshbench.analysis.draws), so
    # numerics, threshold and floor are moves in cumulative probability; None: greedy, by the margin
