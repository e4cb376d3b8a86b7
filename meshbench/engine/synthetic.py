"""SyntheticEngine: the numpy dense Llama plus the hot KV state manager as a BatchEngine."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from meshbench import files
from meshbench.engine.base import (
    PROBE_LIMITS,
    SAMPLING_CONTRACT,
    DecodeItem,
    EngineLimits,
    PrefillChunk,
    SessionHandle,
    StepResult,
    TickResult,
    batch_results,
    check_token_ids,
    fingerprint,
    greedy_step,
    separate_step,
)
from meshbench.engine.setup import EngineSetup, describe
from meshbench.engine.spec import EngineSpec
from meshbench.errors import MeshbenchError
from meshbench.model import llama
from meshbench.model.config import ModelConfig, preset
from meshbench.model.gguf_io import read_weights  # the gguf package itself is imported on first use
from meshbench.model.kv import CacheMiss, HotKvStateManager, SessionCache
from meshbench.model.prefix import PrefixBlocks
from meshbench.model.weights import Weights, init_weights


class SyntheticEngine:
    """Runs prefill and batched decode of the numpy model over per-session KV.

    KV pressure is resolved by evicting least-recently-used sessions; an evicted
    session's next decode returns a cache miss, never a recomputation. With a prefix cache
    (``prefix``), a prompt's first chunk starts from the longest run of cached whole blocks, and a
    prefilled prompt's whole blocks are shared (meshbench.model.kv).
    """

    def __init__(
        self,
        cfg: ModelConfig,
        weights: Weights,
        kv_budget_bytes: int,
        layer_range: tuple[int, int] | None = None,
        prefix: PrefixBlocks | None = None,
    ) -> None:
        if layer_range is not None and tuple(layer_range) != (0, cfg.n_layers):
            raise MeshbenchError(
                f"the synthetic engine needs the full model: layer_range {tuple(layer_range)} is a partial shard "
                f"of layers [0, {cfg.n_layers}); batching runs only where one node holds every layer"
            )
        self.cfg = cfg
        self.weights = weights
        self.kv = HotKvStateManager(cfg.n_layers, cfg.n_kv_heads, cfg.head_dim, cfg.np_dtype, kv_budget_bytes, prefix)
        self._fingerprint: str | None = None

    # --- figures the scheduler budgets against -----------------------------------
    @property
    def recipe_fingerprint(self) -> str:
        if self._fingerprint is None:
            # "numpy-dense-llama" is a frozen identifier: committed bundles carry its hash.
            self._fingerprint = fingerprint(
                {
                    "engine": "numpy-dense-llama",
                    "weights_sha256": self.weights.sha256(),
                    "config": self.cfg.to_dict(),
                    "sampling": SAMPLING_CONTRACT,
                }
            )
        return self._fingerprint

    @property
    def vocab_size(self) -> int:
        return self.cfg.vocab_size

    @property
    def kv_bytes_per_token(self) -> int:
        return self.kv.bytes_per_token

    @property
    def weight_bytes(self) -> int:
        return self.weights.nbytes

    @property
    def scratch_bytes_per_session(self) -> int:
        # One decode row's activations: residual, norm, q/k/v, attention out (~6 x dim),
        # gate/up (2 x ffn), logits (vocab) and one layer's scores over the full context.
        c = self.cfg
        elems = 6 * c.dim + 2 * c.ffn_dim + c.vocab_size + c.n_heads * c.context_length
        return elems * c.itemsize

    @property
    def kv_bytes_in_use(self) -> int:
        return self.kv.total_bytes

    @property
    def kv_bytes_shared(self) -> int | None:
        return None if self.kv.prefix is None else self.kv.prefix_bytes

    # --- work ------------------------------------------------------------------
    def prefill(self, session: SessionHandle, prompt_tokens: Sequence[int]) -> StepResult:
        return self.prefill_chunk(PrefillChunk(session, tuple(prompt_tokens), 0, True))

    def prefill_chunk(self, chunk: PrefillChunk) -> StepResult:
        """A prompt's piece at positions ``chunk.start``...: the first opens the session's cache, a later
        one continues it (a cache miss if it was evicted meanwhile)."""
        session, tokens = chunk.session, chunk.tokens
        if not tokens:
            raise MeshbenchError(f"session {session.session_id}: empty prompt")
        if session.capacity > self.cfg.context_length:
            raise MeshbenchError(
                f"session {session.session_id}: {session.capacity} positions exceed the model's "
                f"context_length {self.cfg.context_length}"
            )
        check_token_ids(tokens, self.cfg.vocab_size)
        sid, epoch, cached = session.session_id, session.epoch, 0
        slot: SessionCache | CacheMiss
        if chunk.start == 0:
            slot = self.kv.open(sid, epoch, session.capacity)
            # the last chunk keeps one position to compute: its logits give the first token
            cached = self.kv.attach(sid, epoch, tokens, len(tokens) - 1 if chunk.last else len(tokens))
        else:
            slot = self.kv.lookup(sid, epoch)
            if isinstance(slot, CacheMiss):
                return StepResult(sid, None, cache_miss=True)
            assert slot.length == chunk.start, (sid, slot.length, chunk.start)
        rest = tokens[cached:]
        if rest:
            r = self.kv.reserve(sid, epoch, len(rest), evict=True)
            assert r.fits, f"a prompt chunk of {len(rest)} tokens cannot fit the KV budget alone: {r}"
            logits = llama.prefill(self.cfg, self.weights, slot, rest)
            self.kv.commit(sid, epoch, len(rest))
            self.kv.written(sid, epoch, rest)
        if not chunk.last:
            return StepResult(sid, None, cached=cached)
        self.kv.publish(sid, epoch)
        step = greedy_step(sid, logits)
        return StepResult(sid, step.token, step.margin, cached=cached, runner_up=step.runner_up)

    def step(self, decode: Sequence[DecodeItem], prefill: Sequence[PrefillChunk]) -> TickResult:
        """The batched decode, then each chunk's prefill: one call per tick."""
        return separate_step(self, decode, prefill)

    def decode_batch(self, items: Sequence[DecodeItem]) -> list[StepResult]:
        check_token_ids([it.token for it in items], self.cfg.vocab_size)
        slots = {}
        for it in items:
            got = self.kv.lookup(it.session_id, it.epoch)
            if isinstance(got, CacheMiss):
                continue
            # A resident cache at another position is a scheduler bug, not a miss to hide.
            assert got.length == it.position, (it.session_id, got.length, it.position)
            if self.kv.reserve(it.session_id, it.epoch, 1, evict=True).fits:
                slots[it.session_id] = got
        # A later reservation may have evicted an earlier batch member: it misses too.
        live = [it for it in items if it.session_id in slots and self.kv.contains(it.session_id, it.epoch)]
        rows: Sequence[object] | np.ndarray = []
        if live:
            rows = llama.decode(
                self.cfg, self.weights, [slots[it.session_id] for it in live], [it.token for it in live]
            )  # (B, vocab)
            for it in live:
                self.kv.commit(it.session_id, it.epoch, 1)
                self.kv.written(it.session_id, it.epoch, [it.token])  # the ids its blocks are keyed by
        return batch_results(items, live, rows)

    def release(self, session_id: str) -> None:
        self.kv.release(session_id)

    def close(self) -> None:
        """Nothing native to free: the KV arrays go with the engine."""


def setup_synthetic(spec: EngineSpec) -> EngineSetup:
    """Seeded weights of a preset, or the dequantized weights of a GGUF file."""
    if spec.device not in ("cpu", "auto"):
        raise MeshbenchError(f"engine synthetic runs on the CPU only (numpy); --device {spec.device} is not possible")
    model_sha = None
    if spec.model:
        path = files.regular_file(spec.model, "model")
        cfg, weights = read_weights(path)
        model_sha = files.sha256(path)
    else:
        cfg = preset(spec.preset)
        weights = init_weights(cfg, spec.seed)

    def make(limits: EngineLimits) -> SyntheticEngine:
        prefix = PrefixBlocks(limits.prefix_block_tokens) if limits.prefix_block_tokens else None
        return SyntheticEngine(cfg, weights, limits.kv_bytes, prefix=prefix)

    info = describe(
        make(PROBE_LIMITS),
        "synthetic",
        preset=None if spec.model else spec.preset,
        model=spec.model,
        model_sha256=model_sha,
        weights_seed=None if spec.model else spec.seed,
        device="cpu",
        dtype=cfg.dtype,
        threads=spec.threads,
        model_config=cfg.to_dict(),
    )
    return EngineSetup(make, info, cfg.vocab_size, cfg.context_length)
