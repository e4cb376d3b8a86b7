"""The records of shared KV: what a level's prefix cache did, and whether its sessions' tokens are those they
give with the cache off (cache equivalence)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True, kw_only=True)
class PrefixStats:
    """A level's prefix cache over its first pass (``meshbench.analysis.prefix.stats``; verify recomputes each
    figure from the level's sessions and ticks)."""

    hits: int  # sessions whose prompt started from cached blocks
    misses: int  # sessions prefilled with no cached block
    saved_tokens: int  # prompt positions taken from the cache instead of computed
    computed_tokens: int  # prompt positions computed
    peak_shared_kv_bytes: int  # the cache's blocks at their most, referenced or not
    # conversations: later turns that found fewer of their earlier turns' whole blocks than those held (evicted
    # between turns: the context prefilled again)
    conversation_misses: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class CacheDivergence:
    """A session whose tokens differ with the cache on and off: where they first do, and the margins there."""

    session_id: str
    epoch: int  # a conversation's turn (1 otherwise)
    index: int  # the first token that differs
    token_on: int | None  # None: the cache-on session has no token there
    token_off: int | None
    margin_on: float | None  # top-1 minus top-2 logit at that token (None: none, or not finite)
    margin_off: float | None


@dataclass(frozen=True, slots=True, kw_only=True)
class CacheVerdict:
    """Cache equivalence at a level (``meshbench.analysis.prefix.cache_verdict``): every session's tokens with
    the prefix cache on equal its tokens with it off. A difference is engine numerics (the rest of a prompt
    prefilled in another batch shape than the whole) where isolation holds, else a leak."""

    holds: bool
    compared: int  # sessions (a conversation: each turn) that completed in both passes
    divergences: list[CacheDivergence]
    classification: str | None  # None when it holds; "engine numerics", "corruption", "leak" or "unclassified"
    later_turns: int | None = None  # conversations: of those compared, later turns (the conversation-equivalence part)
    own_kv: OwnKvReplay | None = None  # conversations that differ: the level replayed on each session's own KV


@dataclass(frozen=True, slots=True, kw_only=True)
class OwnKvReplay:
    """A conversation level replayed without the prefix cache, each later turn continuing its session's own
    llama.cpp sequence cut to the positions the cache gave it (``meshbench.sweep.own_kv``): whether every token the
    engine sampled is the one the cache-on pass recorded. When so, each turn's tokens with the cache are those
    of its session's own KV, and a turn that differs from its cold prefill differs by how its cached positions
    were computed (an answer's by decode, one at a time), not by what the cache held."""

    reproduced: bool
    tokens: int  # tokens compared
    session_id: str | None = None  # the first that differs (None: none does)
    epoch: int | None = None
    index: int | None = None
