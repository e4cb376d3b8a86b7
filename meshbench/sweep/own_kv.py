"""Replay a conversation level without the prefix cache, each later turn on its session's own KV.

With the cache, a later turn starts from its earlier turns' cached blocks: positions its session computed
itself, the answers among them by decode, one token at a time. The cache-off pass prefills the whole context at
once instead, so a turn may differ from it by arithmetic alone. This replay tells that apart from a cache that
gave a turn other KV than its own: it feeds the engine the recorded schedule (every tick's decode feed and prompt
pieces, in order, in the same batches), without the cache; a later turn keeps its session's own llama.cpp
sequence, cut to the positions the cache gave it (``resume``), and prefills the rest. If every token the engine
samples is the one recorded, each turn's tokens with the cache are those of its session's own KV.
"""

from __future__ import annotations

from typing import Sequence

from meshbench.engine.base import DecodeItem, PrefillChunk, SessionHandle, StepResult
from meshbench.records.model import SessionRecord
from meshbench.records.sharing import OwnKvReplay
from meshbench.records.tick import Tick
from meshbench.scheduler.session import GenerationRequest


def own_kv(
    engine, sessions: Sequence[SessionRecord], ticks: Sequence[Tick], requests: Sequence[GenerationRequest]
) -> OwnKvReplay:
    """Replay the level's ``ticks`` on ``engine`` (no prefix cache, a sequence for every session: ``resume``),
    comparing each sampled token with the one ``sessions`` recorded (a level that analysis.prefix.replayable)."""
    record = {(s.session_id, s.epoch): s for s in sessions}
    last_epoch = dict(sorted((sid, e) for sid, e in record))
    prompt = {(r.session_id, 1): r for r in requests}
    epoch: dict[str, int] = {}
    compared = 0
    for t in ticks:
        decode = [DecodeItem(sid, epoch[sid], pos, tok) for sid, pos, tok in t.decode_feed]
        pieces = []
        for sid, _, _ in t.prefill_chunks:
            e = epoch[sid] = epoch.get(sid, 0) + 1
            if e > 1:  # the turn after the one that ended: the conversation so far and the user's next turn
                later = prompt[sid, e - 1].next_turn(record[sid, e - 1].tokens)
                assert later is not None, (sid, e)
                prompt[sid, e] = later
            r, cached = prompt[sid, e], record[sid, e].cached_tokens or 0
            handle = SessionHandle(sid, e, r.total_tokens)
            if cached:  # (nothing cached: the piece starts a fresh sequence, the whole context computed again)
                engine.resume(handle, cached)
            pieces.append(PrefillChunk(handle, tuple(r.prompt_tokens[cached:]), cached, True))
        out = engine.step(decode, pieces)
        answers = [(sid, pos + 1, res) for (sid, pos, _), res in zip(t.decode_feed, out.decode)]
        answers += [(sid, None, res) for (sid, _, _), res in zip(t.prefill_chunks, out.prefill)]
        for sid, position, res in answers:
            if res.error is not None or res.cache_miss:  # (the engine failed the replay: no finding, no verdict)
                raise RuntimeError(f"own-KV replay: {sid}: {res.error or 'cache miss'}")
            compared += 1
            index = _mismatch(res, record[sid, epoch[sid]], position)
            if index is not None:
                return OwnKvReplay(reproduced=False, tokens=compared, session_id=sid, epoch=epoch[sid], index=index)
        for sid in (*t.completed, *t.ended):
            if epoch[sid] == last_epoch[sid]:  # (a turn with another to come keeps its sequence for it)
                engine.release(sid)
    return OwnKvReplay(reproduced=True, tokens=compared)


def _mismatch(res: StepResult, s: SessionRecord, position: int | None) -> int | None:
    """The index of the session's token this step sampled (at ``position``; None: its prompt's first), when it is
    not the one recorded (None: it is)."""
    index = 0 if position is None else position - s.prompt_tokens
    want = s.tokens[index] if 0 <= index < len(s.tokens) else None
    return None if res.token == want else index
