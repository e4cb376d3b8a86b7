"""The record of a conversation's later turns over HTTP, sent again cold (meshbench.endpoint.conversation)."""

from __future__ import annotations

from dataclasses import dataclass

from meshbench.records.completion import Completion
from meshbench.records.margins import Divergence


@dataclass(frozen=True, slots=True, kw_only=True)
class ConversationCold:
    """Every later turn of the reference pass (the lowest level's first repetition), sent again alone and cold:
    the same request, with ``cache_prompt`` false (nothing of its conversation's earlier turns taken from the
    server's prompt cache) and, on the native API, the top-2 log-probabilities per token. In the conversation the
    turn ran warm: the server's cache could serve the earlier turns' KV."""

    concurrency: int  # the reference pass's level
    cold: list[Completion]  # one per later turn the reference pass answered, in its order
    differing: list[str]  # the turns (``s0#t2``) whose answer in the conversation differs from the cold one
    # native: where each differing turn first differs, classified by the cold answer's margin there (near-tie:
    # within the server's measured numerics; confident: a suspected leak); None over chat (text, no margins)
    divergences: list[Divergence] | None = None
