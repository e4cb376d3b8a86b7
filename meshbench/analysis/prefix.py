"""What a prefix cache did at a level, and cache equivalence: every session's tokens with the cache on equal
its tokens with the cache off. Pure: the runner runs the cache-off pass and hands its records over."""

from __future__ import annotations

from typing import Sequence, TypeVar

from meshbench.records.model import SessionRecord
from meshbench.records.sharing import CacheDivergence, CacheVerdict, OwnKvReplay, PrefixStats
from meshbench.records.tick import Tick

T = TypeVar("T")

# isolation holding, a near-tie, or a turn whose session's own KV gives the cache's tokens: the rest of a prompt
# computed in another batch shape, or cached positions computed otherwise than by a cold prefill (an answer by decode)
NUMERICS = "engine numerics"
CORRUPTION = "corruption"  # a confident token, isolation holding: a session's own KV was not what it computed
LEAK = "leak"  # isolation fails too: a session read what another session wrote
UNCLASSIFIED = "unclassified"  # isolation did not run at the level: nothing tells a leak from the rest
HARMLESS = (None, NUMERICS)  # the classes that leave a sweep corruption-free


def stats(sessions: Sequence[SessionRecord], ticks: Sequence[Tick], block_tokens: int) -> PrefixStats:
    """The level's figures from its records: a session that reached its first token is a hit when it took
    cached positions, else a miss; positions saved and computed are summed over the ticks' prompt chunks; a
    conversation's later turn that took fewer than its last turn's whole blocks is a conversation miss."""
    prefilled = [s for s in sessions if s.tokens]
    saved = sum(t.prefix_hit_tokens or 0 for t in ticks)
    return PrefixStats(
        hits=sum(1 for s in prefilled if s.cached_tokens),
        misses=sum(1 for s in prefilled if not s.cached_tokens),
        saved_tokens=saved,
        computed_tokens=sum(t.prefill_tokens for t in ticks) - saved,
        peak_shared_kv_bytes=max((t.kv_bytes_shared or 0 for t in ticks), default=0),
        conversation_misses=conversation_misses(sessions, block_tokens),
    )


def conversation_misses(sessions: Sequence[SessionRecord], block_tokens: int) -> int | None:
    """Later turns whose cached positions fall short of the whole blocks their last turn left (its prompt and the
    answer it was fed: the last token never was), as far as their own prompt allows (its last position is
    computed). None without conversations."""
    by_key = {(s.session_id, s.epoch): s for s in sessions}
    later = [s for s in sessions if s.epoch > 1 and (s.session_id, s.epoch - 1) in by_key]
    if not later:
        return None
    misses = 0
    for s in later:
        last = by_key[s.session_id, s.epoch - 1]
        held = last.prompt_tokens + max(len(last.tokens) - 1, 0)
        want = min(held // block_tokens, (s.prompt_tokens - 1) // block_tokens) * block_tokens
        misses += (s.cached_tokens or 0) < want
    return misses


def _at(values: Sequence[T], i: int) -> T | None:
    return values[i] if i < len(values) else None


def divergence(on: SessionRecord, off: SessionRecord) -> CacheDivergence | None:
    """Where a session's tokens first differ with the cache on and off (None: they do not)."""
    if on.tokens == off.tokens:
        return None
    i = next((k for k, (a, b) in enumerate(zip(on.tokens, off.tokens)) if a != b), min(len(on.tokens), len(off.tokens)))
    return CacheDivergence(
        session_id=on.session_id,
        epoch=on.epoch,
        index=i,
        token_on=_at(on.tokens, i),
        token_off=_at(off.tokens, i),
        margin_on=_at(on.margins, i),
        margin_off=_at(off.margins, i),
    )


def replayable(sessions: Sequence[SessionRecord], ticks: Sequence[Tick]) -> bool:
    """Whether the level can be replayed on own KV: conversations whose turns took from the cache no more than their
    own last turn's prompt and answer (a first turn's hit holds another session's blocks), every turn completed,
    whole prompts (one piece each)."""
    by_key = {(s.session_id, s.epoch): s for s in sessions}
    own = all(  # a later turn's cached positions all its own: its last turn's prompt and answer fed
        (s.cached_tokens or 0) <= (last.prompt_tokens + len(last.tokens) - 1 if last is not None else 0)
        for s in sessions
        for last in [by_key.get((s.session_id, s.epoch - 1))]
    )
    return (
        any(s.epoch > 1 for s in sessions)
        and all(s.done_reason == "COMPLETED" for s in sessions)
        and own
        and all(start == 0 for t in ticks for _, start, _ in t.prefill_chunks)
    )


def cache_verdict(
    sessions: Sequence[SessionRecord],
    cache_off: Sequence[SessionRecord],
    isolation_holds: bool | None,
    near_tie: float,
    own_kv: OwnKvReplay | None = None,
) -> CacheVerdict:
    """The level's sessions (cache on) against the same sessions with the cache off: the ones that completed in
    both (each epoch) are compared token by token. A difference is a leak where isolation fails; where it holds,
    engine numerics when every conversation's first divergence is a near-tie (the cache-off margin below
    ``near_tie``) or the level replayed on its sessions' own KV gave every recorded token (``own_kv``), else
    corruption; unclassified where isolation did not run."""
    off = {(s.session_id, s.epoch): s for s in cache_off if s.done_reason == "COMPLETED"}
    pairs = [
        (s, off[s.session_id, s.epoch])
        for s in sessions
        if s.done_reason == "COMPLETED" and (s.session_id, s.epoch) in off
    ]
    found = [d for d in (divergence(a, b) for a, b in pairs) if d is not None]
    later = [a for a, _ in pairs if a.epoch > 1]
    return CacheVerdict(
        holds=not found,
        compared=len(pairs),
        divergences=found,
        classification=None if not found else _classify(found, isolation_holds, near_tie, own_kv),
        later_turns=len(later) if any(s.epoch > 1 for s in sessions) else None,
        own_kv=own_kv,
    )


def first_turns(found: Sequence[CacheDivergence]) -> list[CacheDivergence]:
    """The divergences that are their conversation's first. A later turn of a session whose earlier turn differed
    has another context with the cache off (that turn's other answer), so its own difference tells nothing more."""
    first: dict[str, int] = {}
    for d in found:
        first[d.session_id] = min(first.get(d.session_id, d.epoch), d.epoch)
    return [d for d in found if d.epoch == first[d.session_id]]


def _classify(
    found: Sequence[CacheDivergence], isolation_holds: bool | None, near_tie: float, own_kv: OwnKvReplay | None
) -> str:
    """A leak where isolation fails; where it holds, what the own-KV replay found where it ran (reproduced:
    numerics; not: corruption); else the margin rule over each conversation's first divergence, unclassified when
    a later turn after one went unexamined (without the cache it had another context)."""
    if isolation_holds is None:
        return UNCLASSIFIED
    if not isolation_holds:
        return LEAK
    if own_kv is not None:
        return NUMERICS if own_kv.reproduced else CORRUPTION
    first = first_turns(found)
    if not all(d.margin_off is not None and d.margin_off < near_tie for d in first):
        return CORRUPTION
    return NUMERICS if len(first) == len(found) else UNCLASSIFIED
