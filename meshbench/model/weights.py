"""Deterministic dense-Llama weights, in the (out, in) layout GGUF uses.

The same seed gives bitwise-identical weights on every machine: every array is drawn
from one seeded ``numpy.random.default_rng`` in a fixed order, in float64, then cast.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from meshbench.model.config import ModelConfig


@dataclass(slots=True)
class LayerWeights:
    attn_norm: np.ndarray  # (dim,)
    wq: np.ndarray  # (n_heads * head_dim, dim)
    wk: np.ndarray  # (n_kv_heads * head_dim, dim)
    wv: np.ndarray  # (n_kv_heads * head_dim, dim)
    wo: np.ndarray  # (dim, n_heads * head_dim)
    ffn_norm: np.ndarray  # (dim,)
    w_gate: np.ndarray  # (ffn_dim, dim)
    w_up: np.ndarray  # (ffn_dim, dim)
    w_down: np.ndarray  # (dim, ffn_dim)


@dataclass(slots=True)
class Weights:
    tok_embd: np.ndarray  # (vocab, dim)
    layers: list[LayerWeights]
    out_norm: np.ndarray  # (dim,)
    output: np.ndarray  # (vocab, dim)

    def named_tensors(self) -> list[tuple[str, np.ndarray]]:
        """Every tensor under its llama.cpp GGUF name, in a fixed order."""
        out = [("token_embd.weight", self.tok_embd)]
        for i, lw in enumerate(self.layers):
            out += [
                (f"blk.{i}.attn_norm.weight", lw.attn_norm),
                (f"blk.{i}.attn_q.weight", lw.wq),
                (f"blk.{i}.attn_k.weight", lw.wk),
                (f"blk.{i}.attn_v.weight", lw.wv),
                (f"blk.{i}.attn_output.weight", lw.wo),
                (f"blk.{i}.ffn_norm.weight", lw.ffn_norm),
                (f"blk.{i}.ffn_gate.weight", lw.w_gate),
                (f"blk.{i}.ffn_up.weight", lw.w_up),
                (f"blk.{i}.ffn_down.weight", lw.w_down),
            ]
        out += [("output_norm.weight", self.out_norm), ("output.weight", self.output)]
        return out

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for _, a in self.named_tensors())

    def sha256(self) -> str:
        h = hashlib.sha256()
        for name, a in self.named_tensors():
            h.update(name.encode())
            h.update(str(a.dtype).encode())
            h.update(np.ascontiguousarray(a).tobytes())
        return h.hexdigest()

    @classmethod
    def from_named(cls, cfg: ModelConfig, tensors: dict[str, np.ndarray]) -> "Weights":
        dt = cfg.np_dtype

        def t(name: str) -> np.ndarray:
            return np.ascontiguousarray(tensors[name], dtype=dt)

        layers = [
            LayerWeights(
                attn_norm=t(f"blk.{i}.attn_norm.weight"),
                wq=t(f"blk.{i}.attn_q.weight"),
                wk=t(f"blk.{i}.attn_k.weight"),
                wv=t(f"blk.{i}.attn_v.weight"),
                wo=t(f"blk.{i}.attn_output.weight"),
                ffn_norm=t(f"blk.{i}.ffn_norm.weight"),
                w_gate=t(f"blk.{i}.ffn_gate.weight"),
                w_up=t(f"blk.{i}.ffn_up.weight"),
                w_down=t(f"blk.{i}.ffn_down.weight"),
            )
            for i in range(cfg.n_layers)
        ]
        return cls(t("token_embd.weight"), layers, t("output_norm.weight"), t("output.weight"))


def init_weights(cfg: ModelConfig, seed: int = 0) -> Weights:
    """Seeded weights scaled so greedy decoding wanders over many tokens.

    Projections are N(0, 1/in) so activations keep unit scale through the residual
    stream. Two deliberate exceptions, measured to keep greedy streams from settling
    on one repeated token: the query projection is N(0, 9/dim), so attention scores
    spread by a few units and the context (not only the last token) moves the argmax;
    the output projection is N(0, 4/dim), so logits spread by a few units.
    """
    rng = np.random.default_rng(seed)
    dt = cfg.np_dtype

    def normal(shape: tuple[int, ...], std: float) -> np.ndarray:
        return (rng.standard_normal(shape) * std).astype(dt)

    def norm_w(n: int) -> np.ndarray:
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(dt)

    d, f, kv = cfg.dim, cfg.ffn_dim, cfg.kv_dim
    tok_embd = normal((cfg.vocab_size, d), 1.0)
    layers = []
    for _ in range(cfg.n_layers):
        layers.append(
            LayerWeights(
                attn_norm=norm_w(d),
                wq=normal((d, d), 3.0 * d**-0.5),
                wk=normal((kv, d), d**-0.5),
                wv=normal((kv, d), d**-0.5),
                wo=normal((d, d), d**-0.5),
                ffn_norm=norm_w(d),
                w_gate=normal((f, d), d**-0.5),
                w_up=normal((f, d), d**-0.5),
                w_down=normal((d, f), f**-0.5),
            )
        )
    out_norm = norm_w(d)
    output = normal((cfg.vocab_size, d), 2.0 * d**-0.5)
    return Weights(tok_embd, layers, out_norm, output)
