"""Replay a level's recorded schedule on a fresh engine and read one session's logits, step by step.

The tick records hold everything an engine was given: each tick's decode feed (session, position,
token), its prompt pieces (session, start, length), and who ended. Fed again in the same order, a
deterministic engine gives the same logits; so two levels' replays show by how much a session's logits
moved when its batch changed shape (the deviation at its first batched step).
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from meshbench.engine.base import DecodeItem, PrefillChunk, SessionHandle
from meshbench.records.documents import LogitDeviation
from meshbench.records.model import LevelRecord


def session_rows(engine, level: LevelRecord, prompts: dict[str, Sequence[int]], session_id: str) -> list[np.ndarray]:
    """Every logits row ``engine`` samples for ``session_id`` while replaying ``level`` (its first epoch)."""
    rows: list[np.ndarray] = []
    engine.tap = lambda sid, row: rows.append(row) if sid == session_id else None
    capacity = {s.session_id: s.prompt_tokens + s.max_new_tokens for s in level.sessions}
    for t in level.tick_records:
        decode = [DecodeItem(sid, 1, pos, tok) for sid, pos, tok in t.decode_feed]
        pieces = [
            PrefillChunk(
                SessionHandle(sid, 1, capacity[sid]),
                tuple(prompts[sid][start : start + n]),
                start,
                start + n == len(prompts[sid]),
            )
            for sid, start, n in t.prefill_chunks
        ]
        engine.step(decode, pieces)
        for sid in (*t.completed, *t.ended):
            engine.release(sid)
    engine.tap = None
    return rows


def batch_sizes(level: LevelRecord, session_id: str, mixed: bool = False) -> list[int]:
    """For each of the session's tokens, how many sessions shared the call that computed it: a prompt's last piece,
    its prefill call (1); with a mixed batch the tick's one call, every session decoded or prefilled in it."""
    sizes = []
    for t in level.tick_records:
        shared = len(set(t.decode_sessions) | {sid for sid, _, _ in t.prefill_chunks}) if mixed else None
        if session_id in t.prefill_sessions:
            sizes = [shared or 1]
        elif session_id in t.decode_sessions:
            sizes.append(shared or len(t.decode_sessions))
    return sizes


def deviation(
    make,
    reference: LevelRecord,
    level: LevelRecord,
    prompts: Mapping[str, Sequence[int]],
    session_id: str,
    upto: int,
    mixed: bool = False,
) -> LogitDeviation:
    """How ``session_id``'s logits moved between the two levels, step by step up to token ``upto`` (the first
    divergence: after it the two streams are fed different tokens): at its first batched step, and at the
    first step that differs at all, with the batch size that computed it."""
    rows = []
    for lv in (reference, level):
        engine = make(lv)  # an engine sized as that level's was
        try:
            rows.append(session_rows(engine, lv, dict(prompts), session_id)[: upto + 1])
        finally:
            engine.close()
    diffs = [float(np.max(np.abs(a - b))) for a, b in zip(*rows)]  # per step, (vocab,) rows
    sizes = batch_sizes(level, session_id, mixed)
    batched = next((k for k, n in enumerate(sizes[: len(diffs)]) if n > 1), None)
    first = next((k for k, d in enumerate(diffs) if d > 0), None)
    span = [float(min(r.min() for r in rows[0])), float(max(r.max() for r in rows[0]))]
    return LogitDeviation(
        first_batched_step=batched,
        at_first_batched_step=None if batched is None else diffs[batched],
        first_differing_step=first,
        batch_at_first_differing_step=None if first is None else sizes[first],
        max_abs_logit_diff=None if first is None else diffs[first],
        logit_range=span,
    )
