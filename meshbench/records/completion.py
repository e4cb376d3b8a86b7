"""An endpoint's answer to one session, as the client recorded it."""

from __future__ import annotations

from dataclasses import dataclass

CANCELLED = "cancelled"  # the stop of an answer its client cut: it disconnected mid-stream (workload.cancel)


@dataclass(frozen=True, slots=True, kw_only=True)
class Completion:
    """An endpoint's answer to one session, as a client saw it (endpoint.schema.json): its stamps are the
    timing record a node's session has too (``submit_ns``, ``token_ns``)."""

    session_id: str
    submit_ns: int
    tokens: list[int]
    text: str
    token_ns: list[int]
    stop: str | None
    predicted: int | None  # tokens the server says it generated
    evaluated: int | None  # prompt tokens the server says it evaluated
    error: str | None  # the request failed: HTTP status, a closed stream, a timeout
    computed: int | None = None  # of the evaluated, those the server computed rather than took from its prompt
    # cache (llama-server's timings.prompt_n; None: not said, or a bundle from before it was recorded)
    margins: list[float | None] | None = None  # per token, top-1 minus top-2 log-probability (asked for only in
    # the margin passes; None elsewhere)
    turn: int | None = None  # a conversation's later turn (2, 3, ...); None: a session's first (or only) turn
    token_bytes: list[int] | None = None  # OpenAI APIs' margin passes: each token's length in bytes (a text answer
    # has no ids: where it first differs is found by byte, then the token there)
    runner_up: list[int | None] | None = None  # native margin passes: each token's second choice, by id (None in
    # bundles made before it was recorded): a near-tie flips to it
    candidates: list[list[int]] | None = None  # native margin passes under sampling: each token's candidates after
    # the samplers, by id, in the server's order (the order its draw walks: meshbench.analysis.draws)
    candidate_probs: list[list[float]] | None = None  # their probabilities after the samplers, one per id
