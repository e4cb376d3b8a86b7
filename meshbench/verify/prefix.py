"""The checks of a level's prefix cache. The block store is replayed from the records: the synthetic prompts
(from the seed), the order of the prompt pieces, and the sessions' ends give every session's cached positions
and, until the cache evicts, the bytes it holds, exactly; its figures are recomputed; the cache-off pass is
checked as the level's own sessions are; and the cache-equivalence verdict is recomputed from it."""

from __future__ import annotations

from meshbench.analysis import figures, prefix
from meshbench.analysis.checks import Checks
from meshbench.model.prefix import block_keys
from meshbench.names import RESULTS
from meshbench.records import serial
from meshbench.records.context import GgufEngineInfo, SyntheticEngineInfo
from meshbench.records.model import LevelRecord
from meshbench.records.sharing import OwnKvReplay
from meshbench.results.typed import NodeBundle
from meshbench.verify import turns


def check_prefix(c: Checks, b: NodeBundle, lv: LevelRecord, at: str) -> None:
    """A level's prefix records: present exactly when the cache is on, and each recomputed from the rest."""
    on = b.cfg.engine.prefix_cache
    for name, value in (("prefix", lv.prefix), ("cache_off", lv.cache_off), ("cache_verdict", lv.cache_verdict)):
        c.equal(RESULTS, f"{at}.{name} (recorded exactly when engine.prefix_cache is on)", on, value is not None)
    c.equal(
        RESULTS,
        f"{at}.sessions[*].cached_tokens (recorded exactly when engine.prefix_cache is on)",
        [on] * len(lv.sessions),
        [s.cached_tokens is not None for s in lv.sessions],
    )
    c.equal(
        RESULTS,
        f"{at}.tick_records[*].prefix_hit_tokens and kv_bytes_shared (recorded exactly when the cache is on)",
        [(on, on)] * len(lv.tick_records),
        [(t.prefix_hit_tokens is not None, t.kv_bytes_shared is not None) for t in lv.tick_records],
    )
    if not on or lv.prefix is None or lv.cache_off is None or lv.cache_verdict is None:
        return
    recomputed = prefix.stats(lv.sessions, lv.tick_records, b.cfg.engine.block_tokens)
    c.equal(RESULTS, f"{at}.prefix (recomputed)", serial.to_json(recomputed), serial.to_json(lv.prefix))
    c.equal(
        RESULTS,
        f"{at}: the sessions' cached_tokens sum to the ticks' prefix_hit_tokens",
        sum(t.prefix_hit_tokens or 0 for t in lv.tick_records),
        sum(s.cached_tokens or 0 for s in lv.sessions),
    )
    _check_replay(c, b, lv, at)
    _check_cache_off(c, b, lv, at)


def _prompts(c: Checks, b: NodeBundle, lv: LevelRecord, at: str) -> dict[tuple[str, int], tuple[int, ...]] | None:
    """Each session's prompt ids by (session, epoch): real prompts tokenized by the model, or synthetic prompts
    drawn from the seed over the model's vocabulary; a conversation's later turn is the last turn's prompt, its
    answer and the user's ids."""
    engine = b.results.engine
    vocab = engine.model_config.get("vocab_size") if isinstance(engine, SyntheticEngineInfo) else None
    if isinstance(engine, GgufEngineInfo):
        vocab = engine.vocab_size
    if not isinstance(vocab, int) or isinstance(vocab, bool) or vocab < 1:
        c.equal(RESULTS, f"{at}: the engine's vocabulary size (the prompts' vocabulary)", "a positive integer", vocab)
        return None
    wl = b.cfg.workload
    if wl.prompts is not None and wl.prompt_ids is None:  # verify gives them where the model is (run.with_prompt_ids)
        c.until_rerun.append(
            f"{at}: the prefix cache's replay needs the real prompts tokenized by the model, which is not here "
            "(unchecked; --rerun checks it)"
        )
        return None
    turns = {(r.session_id, 1): r for r in wl.requests(vocab)}
    for s in sorted(lv.sessions, key=lambda s: s.epoch):  # each later turn as the node built it (next_turn)
        r = turns.get((s.session_id, s.epoch))
        later = r.next_turn(s.tokens) if r is not None else None
        if later is not None:
            turns[s.session_id, s.epoch + 1] = later
    return {key: r.prompt_tokens for key, r in turns.items()}


def _check_replay(c: Checks, b: NodeBundle, lv: LevelRecord, at: str) -> None:
    """The block store replayed in the order the engine wrote the prompt pieces: each session's first piece takes
    the longest run of stored blocks its prompt begins with (its last position always computed), a prompt's last
    piece stores its whole blocks (with mixed batches, after every piece of its tick took its run). Until the
    store evicts (its bytes, or a hit, fall short of the replay's), its bytes are the replay's; after, they lie
    between the blocks live sessions reference and the replay's. The KV held is the live sessions' own positions
    plus the store's, throughout."""
    prompts = _prompts(c, b, lv, at)
    if prompts is None:
        return
    r = _Replay(
        prompts, b.cfg.engine.block_tokens, {(s.session_id, s.epoch): s.cached_tokens or 0 for s in lv.sessions}
    )
    r.floor = lv.cache_misses == 0
    current = turns.Current(lv.sessions)
    per = b.results.engine.kv_bytes_per_token
    for t in lv.tick_records:
        where = f"{at}.tick_records[{t.tick}]"
        # a cancel or an eviction fires between ticks, before this tick's pieces take their runs: released then
        fired = [x.session_id for e in lv.fault_events if e.tick == t.tick and e.fault.startswith(("evict:", "cancel:"))
                 for x in e.sessions]  # fmt: skip
        for sid in fired:
            s = current.get(sid)
            if s is not None:
                r.release((sid, s.epoch), s.tokens)
        chunks = [(sid, current.get(sid), start, n) for sid, start, n in t.prefill_chunks]
        pieces = [(sid, (sid, s.epoch if s is not None else 0), start, n) for sid, s, start, n in chunks]
        for group in [pieces] if b.cfg.engine.mixed_batch else [[p] for p in pieces]:
            for sid, key, start, n in group:
                if start == 0:
                    r.take(sid, key, n)
            for sid, key, start, n in group:
                r.written(sid, key, start, n)
        # released, however it ended: the whole blocks it wrote, prompt and answer, are shared as it goes
        for sid in (*t.completed, *t.ended):
            s = current.get(sid)
            if s is not None:
                r.release((sid, s.epoch), s.tokens)
        for sid in (*t.completed, *t.ended):
            r.live.pop(sid, None)
            current.end(sid)
        r.check_bytes(c, where, t.kv_bytes_shared or 0, per)
        own = (t.stored_tokens - sum(len(k) for k in r.live.values()) * r.bt) * per + (t.kv_bytes_shared or 0)
        if lv.cache_misses == 0:
            c.equal(RESULTS, f"{where}.kv_bytes (the live sessions' own positions x {per}, plus the store's)", own,
                    t.kv_bytes)  # fmt: skip
        else:  # (an evicted session holds no KV of its own before its miss is seen, and is live until then)
            c.equal(RESULTS, f"{where}.kv_bytes (at most the live sessions' own positions x {per}, plus the store's)",
                    True, t.kv_bytes <= own)  # fmt: skip
    for s in lv.sessions:
        if (s.session_id, s.epoch) in r.replayed:
            c.equal(
                RESULTS,
                f"{at}.sessions[{s.session_id}#{s.epoch}].cached_tokens (the replayed store's run of blocks of "
                f"{r.bt}; at most that once it evicted)",
                r.replayed[s.session_id, s.epoch],
                s.cached_tokens,
            )
    if lv.tick_records:
        last = lv.tick_records[-1]
        c.equal(RESULTS, f"{at}.tick_records[-1].kv_bytes (only the cache's left)", last.kv_bytes_shared, last.kv_bytes)


class _Replay:
    """The replayed store (it never evicts), each session's replayed hit, and the blocks each live session
    references."""

    def __init__(
        self, prompts: dict[tuple[str, int], tuple[int, ...]], bt: int, cached: dict[tuple[str, int], int]
    ) -> None:
        self.prompts, self.bt, self.cached = prompts, bt, cached
        self.store: set[bytes] = set()
        self.replayed: dict[tuple[str, int], int] = {}
        self.live: dict[str, list[bytes]] = {}  # session -> the blocks it references now
        self.progress: dict[tuple[str, int], int] = {}  # session -> the prompt positions written so far
        self.exact = True
        self.floor = True  # the blocks live sessions reference bound the store's bytes from below (no misses)
        self.short: list[tuple[tuple[str, int], int, int]] = []  # this tick's hits short of an exact replay's

    def take(self, sid: str, key: tuple[str, int], n: int) -> None:
        """A prompt's first piece of ``n`` positions takes its run."""
        ids = self.prompts.get(key, ())
        keys = block_keys(ids, self.bt)
        run = _run(keys, self.store, n - 1 if n == len(ids) else n, self.bt)
        # once the store evicted, the replay (which never evicts) only bounds what a session can have found
        if self.exact and self.cached.get(key, 0) < run * self.bt:  # (judged at this tick's end: check_bytes)
            self.short.append((key, self.cached.get(key, 0), run * self.bt))
        self.exact = self.exact and self.cached.get(key, 0) >= run * self.bt
        got = run * self.bt if self.exact else min(self.cached.get(key, 0), run * self.bt)
        self.replayed[key] = got
        self.live[sid] = keys[: got // self.bt]

    def written(self, sid: str, key: tuple[str, int], start: int, n: int) -> None:
        """A piece written; the prompt's last stores its whole blocks, and the session references them all."""
        ids = self.prompts.get(key, ())
        self.progress[key] = start + n
        if start + n == len(ids):
            keys = block_keys(ids, self.bt)
            self.store.update(keys)
            self.live[sid] = keys

    def release(self, key: tuple[str, int], tokens: list[int]) -> None:
        """A session's KV released: the whole blocks of what it wrote are stored, its prompt (as far as it was
        written) and its answer but the last token (sampled, never fed)."""
        ids = self.prompts.get(key, ())
        written = ids + tuple(tokens[:-1]) if tokens else ids[: self.progress.get(key, 0)]
        self.store.update(block_keys(written, self.bt))

    def check_bytes(self, c: Checks, where: str, shared: int, per: int) -> None:
        """The store's bytes: the replay's exactly until it evicts; then at most the replay's and at least the
        blocks live sessions reference (a referenced block is never evicted)."""
        most = len(self.store) * self.bt * per
        for (sid, epoch), got, held in self.short:  # a hit fell short while the store still holds the replay's bytes
            why = f"the store held {held} of its prompt, and its bytes are still the replay's {most}: nothing evicted"
            c.equal(RESULTS, f"{where}: {sid}#{epoch}'s hit of {got} positions ({why})", True, shared != most)
        self.short = []
        if self.exact and shared == most:
            return
        self.exact = False
        # (a session the engine evicted is live here until its next read misses: with misses, no lower bound)
        least = len({k for keys in self.live.values() for k in keys}) * self.bt * per if self.floor else 0
        c.equal(
            RESULTS,
            f"{where}.kv_bytes_shared (once the store departed from the replay, as when it evicts: between the "
            f"{least} bytes of the blocks live sessions reference and the replayed store's {most})",
            True,
            least <= shared <= most,
        )


def _run(keys: list[bytes], store: set[bytes], limit: int, bt: int) -> int:
    """The blocks a first piece of ``limit`` positions finds: the longest run of stored keys from the first."""
    run = 0
    while run < len(keys) and (run + 1) * bt <= limit and keys[run] in store:
        run += 1
    return run


def _check_cache_off(c: Checks, b: NodeBundle, lv: LevelRecord, at: str) -> None:
    """The cache-off pass: the level's sessions as its own are (lengths, digests, no cached positions), every one
    completed in both compared, and the verdict recomputed."""
    off = lv.cache_off or []
    on = {(s.session_id, s.epoch): s for s in lv.sessions}
    c.equal(RESULTS, f"{at}.cache_off sessions (the level's)", sorted(on), sorted((s.session_id, s.epoch) for s in off))
    for j, s in enumerate(off):
        where = f"{at}.cache_off[{j}]"
        c.equal(RESULTS, f"{where}.digest (of its tokens)", figures.token_digest(s.tokens), s.digest)
        c.equal(RESULTS, f"{where}.cached_tokens (none: the cache is off)", None, s.cached_tokens)
        c.equal(RESULTS, f"{where}.margins (one per token)", len(s.tokens), len(s.margins))
        mine = on.get((s.session_id, s.epoch))
        if mine is not None:
            c.equal(
                RESULTS,
                f"{where} prompt and new tokens (the level's session's)",
                [mine.prompt_tokens, mine.max_new_tokens],
                [s.prompt_tokens, s.max_new_tokens],
            )
    if b.cfg.clock == "tick" and not lv.faults:  # the same schedule: every session ends as it did
        c.equal(
            RESULTS,
            f"{at}.cache_off ends (the level's: the cache changes no decision)",
            sorted((s.session_id, s.epoch, s.done_reason) for s in lv.sessions),
            sorted((s.session_id, s.epoch, s.done_reason) for s in off),
        )
    near_tie = figures.near_tie(b.results.engine)
    own = lv.cache_verdict.own_kv if lv.cache_verdict is not None else None
    verdict = prefix.cache_verdict(lv.sessions, off, lv.isolation_verdict.holds, near_tie, own)
    c.equal(RESULTS, f"{at}.cache_verdict (recomputed)", serial.to_json(verdict), serial.to_json(lv.cache_verdict))
    _check_own_kv(c, b, lv, at, own)


def _check_own_kv(c: Checks, b: NodeBundle, lv: LevelRecord, at: str, own: OwnKvReplay | None) -> None:
    """The own-KV replay (meshbench.sweep.own_kv): only where a conversation's turns differ with the cache on and
    off and the level can be replayed; its count within the level's tokens, a mismatch naming one of its turns.
    What it found is taken as recorded here: verify --rerun runs it again."""
    if own is None:
        return
    differs = lv.cache_verdict is not None and not lv.cache_verdict.holds
    c.equal(RESULTS, f"{at}.cache_verdict.own_kv (only where turns differ, replayable)", True,
            differs and prefix.replayable(lv.sessions, lv.tick_records))  # fmt: skip
    engine = b.results.engine
    c.equal(RESULTS, f"{at}.cache_verdict.own_kv (only on llama.cpp with kv_unified off: one stream a sequence)",
            True, isinstance(engine, GgufEngineInfo) and engine.kv_unified is False)  # fmt: skip
    total = sum(len(s.tokens) for s in lv.sessions)
    c.equal(RESULTS, f"{at}.cache_verdict.own_kv.tokens (within the level's {total})", True,
            0 < own.tokens <= total and (own.tokens == total or not own.reproduced))  # fmt: skip
    turns = {(s.session_id, s.epoch): len(s.tokens) for s in lv.sessions}
    named = 0 <= (own.index or 0) < turns.get((own.session_id or "", own.epoch or 0), 0) and own.index is not None
    nothing = own.session_id is None and own.epoch is None and own.index is None
    c.equal(RESULTS, f"{at}.cache_verdict.own_kv: a mismatch names a turn and token of the level, a match none",
            [not own.reproduced, own.reproduced], [named, nothing])  # fmt: skip
    c.until_rerun.append(
        f"{at}.cache_verdict.own_kv.reproduced: taken as recorded (unchecked; --rerun replays the level)"
    )
