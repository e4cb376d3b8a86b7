"""GgufEngine: llama.cpp through llama-cpp-python's low-level API, one llama_decode per tick.

Each live session owns one llama.cpp sequence id. Prefill puts a whole prompt in one llama_decode with logits on
its last token only; a tick's decode puts every batch member's next token, each with its own seq_id and position,
in ONE llama_decode. A finished session's cells are removed by sequence (llama_memory_seq_rm). Defaults are the
configuration measured to be batch-invariant on CPU for quantized weights: flash attention off, kv_unified off,
each prompt prefilled alone.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any, Callable, Sequence

import numpy as np

from meshbench import limits, machine
from meshbench.engine import recipe
from meshbench.engine.base import (
    SAMPLING_CONTRACT,
    DecodeItem,
    EngineLost,
    PrefillChunk,
    SessionHandle,
    StepResult,
    TickResult,
    batch_results,
    check_token_ids,
    fingerprint,
    greedy_step,
    raised,
    separate_step,
)
from meshbench.engine.gguf_prefix import LlamaMemory, PrefixHolders
from meshbench.engine.llama_model import (
    KV_TYPES,
    LoadedModel,
    check_native_sizes,
    llama_cpp_lib,
)
from meshbench.engine.profile import Profile
from meshbench.engine.spec import EngineSpec
from meshbench.errors import MeshbenchError
from meshbench.model.prefix import PrefixBlocks

RETAINED_MIN = 16  # sequences a prefix cache keeps for ended sessions' blocks, at the fewest


def plain(model: LoadedModel, **settings: Any) -> EngineSpec:
    """A bench's or a test's GgufEngine settings: ``settings`` over a gguf engine's defaults, flash attention off."""
    return EngineSpec(kind="gguf", model=str(model.path), **{"flash_attn": False, **settings})


class GgufEngine:
    def __init__(
        self,
        model: LoadedModel,
        n_seq_max: int,
        seq_capacity: int,
        spec: EngineSpec | None = None,  # its settings (engine.spec: each declared there once); None: plain()
        max_prompt: int = 512,
        prefix_block_tokens: int = 0,
        kv_budget: int = 0,
    ) -> None:
        spec = spec if spec is not None else plain(model)
        lib = llama_cpp_lib()
        check_native_sizes(model, n_seq_max, seq_capacity, spec.threads)
        if prefix_block_tokens and (lib.llama_model_is_recurrent(model.ptr) or lib.llama_model_is_hybrid(model.ptr)):
            raise MeshbenchError(
                f"engine.prefix_cache: {model.arch} keeps a recurrent state, which llama.cpp copies whole "
                "(never a prefix's): the prefix cache needs an attention-only model"
            )
        self.lib, self.model = lib, model
        self.kv_type = kv_type = spec.kv_type
        self.flash_attn, self.kv_unified = spec.flash_attn, spec.kv_unified
        self.mixed = mixed = spec.mixed_batch  # a tick's decode items and prompt chunks in ONE llama_decode
        self.tiled_mm = spec.tiled_mm  # set in this process's environment by whoever started it (EngineProcess)
        # eos: ban: end-of-generation tokens never win the argmax (llama-server's ignore_eos)
        self.banned = np.asarray(model.eog, dtype=np.int64) if spec.ban_eog and model.eog else None
        cp = lib.llama_context_default_params()
        # A prefix cache keeps ended sessions' sequences for their blocks (engine.gguf_prefix): as many again, and
        # at least 16 (with too few, it evicts cached blocks to free a sequence, not for want of KV).
        self.sessions_max = n_seq_max
        if prefix_block_tokens:
            n_seq_max = min(n_seq_max + max(n_seq_max, RETAINED_MIN), limits.MAX_LLAMA_SEQUENCES)
        # Without kv_unified each sequence gets n_ctx / n_seq_max cells: n_ctx sized for each to hold a whole session
        cp.n_seq_max, cp.n_ctx = n_seq_max, n_seq_max * seq_capacity
        # Mixed: a whole prompt (the first of a tick may exceed the prefill budget) beside every decode.
        self.n_batch = max(max_prompt + n_seq_max if mixed else max(max_prompt, n_seq_max), 32)
        cp.n_batch = self.n_batch
        # engine.n_ubatch, else llama.cpp's own (512), where a tick is larger: as llama-server's -ub, a bounded buffer
        self.n_ubatch = cp.n_ubatch = min(self.n_batch, spec.n_ubatch or int(cp.n_ubatch))
        n_threads = spec.threads or machine.usable_cpus()
        cp.n_threads = cp.n_threads_batch = n_threads
        cp.flash_attn_type = recipe.flash_attn_type(lib, spec.flash_attn)  # (auto: the setup reads llama.cpp's)
        cp.kv_unified = spec.kv_unified
        cp.type_k = cp.type_v = KV_TYPES[kv_type][0]
        cp.no_perf = True
        self.ctx = lib.llama_init_from_model(model.ptr, cp)
        if not self.ctx:
            raise MeshbenchError(
                f"llama.cpp could not create a context of {cp.n_ctx} cells for {n_seq_max} sequences (out of memory?)"
            )
        self.threads = n_threads
        self.n_seq_max = int(lib.llama_n_seq_max(self.ctx))
        self.seq_cells = int(lib.llama_n_ctx_seq(self.ctx))
        assert self.seq_cells >= seq_capacity, (self.seq_cells, seq_capacity)
        self.mem = lib.llama_get_memory(self.ctx)
        self.batch = lib.llama_batch_init(self.n_batch, 0, 1)
        self._seq_ids: dict[str, int] = {}  # session id -> llama.cpp sequence id
        self._stored: dict[str, int] = {}  # session id -> positions written
        self._epoch: dict[str, int] = {}
        self._kv_bytes_per_token = model.kv_bytes_per_token(kv_type)
        self.prefix: PrefixHolders | None = None
        if prefix_block_tokens:
            memory = LlamaMemory(lib, self.mem)
            self.prefix = PrefixHolders(PrefixBlocks(prefix_block_tokens), memory, spec.kv_unified)
        self._ids: dict[str, list[int]] = {}  # session id -> the ids at its positions (its blocks' keys)
        self._budget_positions = kv_budget // self._kv_bytes_per_token if kv_budget else 0
        self.tap: Callable[[str, np.ndarray], None] | None = None  # sees every sampled row (meshbench.sweep.replay)
        self.profile: Profile | None = None  # where the time of each call goes (meshbench bench breakdown)

    # --- figures --------------------------------------------------------------------
    @property
    def recipe_fingerprint(self) -> str:
        recipe = {
            "engine": "llama.cpp",
            "model_sha256": self.model.sha256,
            "flash_attn": self.flash_attn,
            "kv_unified": self.kv_unified,
            "kv_type": self.kv_type,
            "n_ubatch": self.n_ubatch,
            "device": self.model.device,
            "sampling": SAMPLING_CONTRACT + (":eog-banned" if self.banned is not None else ""),
            "repack": self.model.repack,
            "tiled_mm": self.tiled_mm,
        }
        # (mixed_batch absent otherwise: the fingerprints of separate calls stay what they were)
        return fingerprint({**recipe, "mixed_batch": True} if self.mixed else recipe)

    @property
    def vocab_size(self) -> int:
        return self.model.vocab_size

    @property
    def kv_bytes_per_token(self) -> int:
        return self._kv_bytes_per_token

    @property
    def weight_bytes(self) -> int:
        return self.model.weight_bytes

    @property
    def scratch_bytes_per_session(self) -> int:
        # One output row of logits plus one token's activations (float32).
        m = self.model
        return 4 * (m.vocab_size + 8 * m.n_embd)

    @property
    def kv_bytes_in_use(self) -> int:
        """Every session's own positions, and the prefix cache's blocks once each (as the synthetic engine counts
        them; without kv_unified llama.cpp holds copies, in cells it allocated up front)."""
        return self._held_positions() * self._kv_bytes_per_token

    @property
    def kv_bytes_shared(self) -> int | None:
        return None if self.prefix is None else self.prefix.positions * self._kv_bytes_per_token

    def _held_positions(self) -> int:
        if self.prefix is None:
            return sum(self._stored.values())
        own = sum(n - self.prefix.shared(self._seq_ids[sid]) for sid, n in self._stored.items())
        return own + self.prefix.positions

    def _make_room(self, n: int) -> None:
        """Before ``n`` positions are written: evict unreferenced cached blocks while the KV held would exceed the
        node's budget (sessions are the node's to budget: their own positions are never evicted here)."""
        if self.prefix is not None and self._budget_positions:
            over = self._held_positions() + n - self._budget_positions
            if over > 0:
                self.prefix.evict_positions(over)

    # --- work -------------------------------------------------------------------------
    def _fill(self, rows: Sequence[tuple[int, int, int, bool]]) -> None:
        b = self.batch
        b.n_tokens = len(rows)
        for i, (tok, seq_id, pos, want) in enumerate(rows):
            b.token[i] = tok
            b.pos[i] = pos
            b.n_seq_id[i] = 1
            b.seq_id[i][0] = seq_id
            b.logits[i] = want

    def _decode(self, phase: str = "decode") -> None:
        t0 = time.perf_counter_ns() if self.profile is not None else 0
        rc = self.lib.llama_decode(self.ctx, self.batch)
        if self.profile is not None:
            self.profile.add(f"{phase}_llama_ns", time.perf_counter_ns() - t0)
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc}")

    def _logits(self, i: int, session_id: str) -> np.ndarray:
        ptr = self.lib.llama_get_logits_ith(self.ctx, i)
        if not ptr:
            raise RuntimeError(f"llama_get_logits_ith({i}) returned NULL")
        row = np.ctypeslib.as_array(ptr, shape=(self.model.vocab_size,))  # (vocab,): a view of llama.cpp's buffer,
        if self.tap is not None:  # read before the next llama_decode overwrites it
            row = row.copy()
            self.tap(session_id, row)
        return row

    def prefill(self, session: SessionHandle, prompt_tokens: Sequence[int]) -> StepResult:
        return self.prefill_chunk(PrefillChunk(session, tuple(prompt_tokens), 0, True))

    def _check_chunk(self, chunk: PrefillChunk) -> None:
        check_token_ids(chunk.tokens, self.model.vocab_size)
        sid = chunk.session.session_id
        if len(chunk.tokens) > self.n_batch:
            raise MeshbenchError(
                f"session {sid}: prompt of {len(chunk.tokens)} tokens exceeds the batch of {self.n_batch}"
            )
        if chunk.session.capacity > self.seq_cells:
            raise MeshbenchError(
                f"session {sid}: {chunk.session.capacity} positions exceed the {self.seq_cells} cells of a sequence"
            )

    def _sequence(self, chunk: PrefillChunk) -> tuple[int | None, int]:
        """The llama.cpp sequence a chunk writes and its positions taken from the prefix cache: a fresh sequence
        for a prompt's first piece (the lowest free id keeps live sessions on consecutive ids), the session's
        own after; None: it was dropped."""
        sid = chunk.session.session_id
        if chunk.start > 0:
            if self._epoch.get(sid) != chunk.session.epoch:
                return None, 0
            assert self._stored[sid] == chunk.start, (sid, self._stored[sid], chunk.start)
            return self._seq_ids[sid], 0
        self.release(sid)
        seq = self._free_sequence(sid)
        # Own the sequence before decoding: if llama_decode fails, release() still clears its cells.
        self._seq_ids[sid], self._stored[sid], self._epoch[sid], self._ids[sid] = seq, 0, chunk.session.epoch, []
        if self.prefix is None:
            return seq, 0
        # the last piece keeps one position to compute: its logits give the first token
        cached = self.prefix.attach(seq, chunk.tokens, len(chunk.tokens) - 1 if chunk.last else len(chunk.tokens))
        self._stored[sid] = cached
        self._ids[sid] = list(chunk.tokens[:cached])
        return seq, cached

    def _free_sequence(self, sid: str) -> int:
        retained = self.prefix.retained if self.prefix is not None else set()
        free = sorted(set(range(self.n_seq_max)) - set(self._seq_ids.values()) - retained)
        if free:
            return free[0]
        seq = self.prefix.free_one() if self.prefix is not None else None
        if seq is None:
            raise RuntimeError(f"no free llama.cpp sequence for {sid} ({self.n_seq_max} in use)")
        self.lib.llama_memory_seq_rm(self.mem, seq, -1, -1)
        return seq

    def _written(self, sid: str, tokens: Sequence[int]) -> None:
        self._stored[sid] += len(tokens)
        self._ids[sid].extend(tokens)

    def prefill_chunk(self, chunk: PrefillChunk) -> StepResult:
        """One llama_decode for a prompt's piece, logits on its last position only when it is the last."""
        self._check_chunk(chunk)
        sid = chunk.session.session_id
        seq_id, cached = self._sequence(chunk)
        if seq_id is None:
            return StepResult(sid, None, cache_miss=True)
        rest = chunk.tokens[cached:]
        if rest:
            self._make_room(len(rest))
            start = chunk.start + cached
            self._fill([(t, seq_id, start + p, chunk.last and p == len(rest) - 1) for p, t in enumerate(rest)])
            self._decode("prefill")
            self._written(sid, rest)
        if not chunk.last:
            return StepResult(sid, None, cached=cached)
        if self.prefix is not None:
            self.prefix.publish(seq_id, self._ids[sid])
        t0 = time.perf_counter_ns()
        out = greedy_step(sid, self._logits(-1, sid), self.banned)
        if self.profile is not None:
            self.profile.add("sample_ns", time.perf_counter_ns() - t0, rows=1)
        return StepResult(sid, out.token, out.margin, cached=cached, runner_up=out.runner_up)

    def step(self, decode: Sequence[DecodeItem], prefill: Sequence[PrefillChunk]) -> TickResult:
        """A tick's work: with ``mixed``, every decode item and prompt chunk in ONE llama_decode; else the
        decode batch and each chunk in calls of their own (the batch-invariant default)."""
        if not self.mixed or len(prefill) + bool(decode) < 2:
            return separate_step(self, decode, prefill)
        t0 = time.perf_counter_ns()
        try:
            out = self._mixed_step(decode, prefill)
        except EngineLost:
            raise
        except Exception as e:
            out = TickResult(
                [raised(it.session_id, "step", e) for it in decode],
                [raised(c.session.session_id, "step", e) for c in prefill],
            )
        out.decode_ns = time.perf_counter_ns() - t0  # one call: it all counts as the decode's wait
        return out

    def _mixed_step(self, decode: Sequence[DecodeItem], prefill: Sequence[PrefillChunk]) -> TickResult:
        check_token_ids([it.token for it in decode], self.model.vocab_size)
        live = [it for it in decode if self._epoch.get(it.session_id) == it.epoch]
        rows = []  # (token, seq_id, position, wants logits, whose)
        for it in live:
            assert self._stored[it.session_id] == it.position, (it.session_id, self._stored[it.session_id])
            rows.append((it.token, self._seq_ids[it.session_id], it.position, True, ("decode", it.session_id)))
        seqs = {}
        for c in prefill:
            self._check_chunk(c)
            sid = c.session.session_id
            seqs[sid] = seq_id, cached = self._sequence(c)
            if seq_id is not None:
                n = len(c.tokens) - cached
                rows += [
                    (t, seq_id, c.start + cached + p, c.last and p == n - 1, ("prefill", sid))
                    for p, t in enumerate(c.tokens[cached:])
                ]
        if len(rows) > self.n_batch:
            raise MeshbenchError(f"a tick of {len(rows)} tokens exceeds the batch of {self.n_batch}")
        rows.sort(key=lambda r: (r[1], r[2]))  # llama.cpp wants each sequence's tokens together, in order
        self._make_room(len(rows))
        self._fill([r[:4] for r in rows])
        self._decode()
        logits = {r[4]: self._logits(i, r[4][1]) for i, r in enumerate(rows) if r[3]}
        for it in live:
            self._written(it.session_id, [it.token])
        chunks = [self._chunk_result(c, *seqs[c.session.session_id], logits) for c in prefill]
        return TickResult(
            batch_results(decode, live, [logits[("decode", it.session_id)] for it in live], self.banned), chunks
        )

    def _chunk_result(self, c: PrefillChunk, seq_id: int | None, cached: int, logits: dict) -> StepResult:
        """A chunk's answer in a mixed tick, once its rows are decoded."""
        sid = c.session.session_id
        if seq_id is None:
            return StepResult(sid, None, cache_miss=True)
        self._written(sid, c.tokens[cached:])
        if not c.last:
            return StepResult(sid, None, cached=cached)
        if self.prefix is not None:
            self.prefix.publish(seq_id, self._ids[sid])
        out = greedy_step(sid, logits[("prefill", sid)], self.banned)
        return StepResult(sid, out.token, out.margin, cached=cached, runner_up=out.runner_up)

    def decode_batch(self, items: Sequence[DecodeItem]) -> list[StepResult]:
        check_token_ids([it.token for it in items], self.model.vocab_size)
        live = [it for it in items if self._epoch.get(it.session_id) == it.epoch]
        for it in live:  # a live sequence at another position is a scheduler bug, not a miss to hide
            assert self._stored[it.session_id] == it.position, (it.session_id, self._stored[it.session_id])
        # llama.cpp groups consecutive increasing sequence ids: put the batch in seq-id order.
        live.sort(key=lambda it: self._seq_ids[it.session_id])
        rows = []
        if live:
            self._make_room(len(live))
            self._fill([(it.token, self._seq_ids[it.session_id], it.position, True) for it in live])
            self._decode()
        t0 = time.perf_counter_ns()
        for i, it in enumerate(live):
            self._written(it.session_id, [it.token])
            rows.append(self._logits(i, it.session_id))
        out = batch_results(items, live, rows, self.banned)
        if self.profile is not None:
            self.profile.add("sample_ns", time.perf_counter_ns() - t0, rows=len(live))
        return out

    def resume(self, session: SessionHandle, keep: int) -> None:
        """A replay's later turn on the session's own sequence, no prefix cache: its first ``keep`` positions kept
        (meshbench.sweep.replay.own_kv)."""
        sid = session.session_id
        assert self.prefix is None and keep <= self._stored[sid], (sid, keep, self._stored[sid])
        self.lib.llama_memory_seq_rm(self.mem, self._seq_ids[sid], keep, -1)
        self._stored[sid], self._ids[sid], self._epoch[sid] = keep, self._ids[sid][:keep], session.epoch

    def release(self, session_id: str) -> None:
        """Clear the session's sequence; with a prefix cache its whole blocks stay cached first, and the sequence
        is kept (retained) while it holds a block no other sequence does."""
        seq_id = self._seq_ids.pop(session_id, None)
        self._stored.pop(session_id, None)
        self._epoch.pop(session_id, None)
        ids = self._ids.pop(session_id, [])
        if seq_id is not None and not (self.prefix is not None and self.prefix.release(seq_id, ids)):
            self.lib.llama_memory_seq_rm(self.mem, seq_id, -1, -1)

    def close(self) -> None:
        if self.ctx:
            self.lib.llama_batch_free(self.batch)
            self.lib.llama_free(self.ctx)
            self.ctx = None

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()
