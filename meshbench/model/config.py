"""Model configuration and the named presets."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from meshbench.errors import MeshbenchError
from meshbench.model.kv import kv_bytes_per_token

_DTYPES: dict[str, type[np.floating]] = {"float32": np.float32, "float64": np.float64}


@dataclass(frozen=True, slots=True)
class ModelConfig:
    vocab_size: int
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    ffn_dim: int
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    dtype: str = "float32"
    context_length: int = 4096

    def __post_init__(self) -> None:
        for name in ("vocab_size", "dim", "n_layers", "n_heads", "n_kv_heads", "ffn_dim", "context_length"):
            if getattr(self, name) <= 0:
                raise MeshbenchError(f"model config: {name} must be positive, got {getattr(self, name)}")
        if self.dim % self.n_heads:
            raise MeshbenchError(f"model config: dim {self.dim} is not a multiple of n_heads {self.n_heads}")
        if self.n_heads % self.n_kv_heads:
            raise MeshbenchError(
                f"model config: n_heads {self.n_heads} is not a multiple of n_kv_heads {self.n_kv_heads}"
            )
        if self.head_dim % 2:
            raise MeshbenchError(f"model config: head_dim {self.head_dim} must be even for rotary embedding")
        if self.dtype not in _DTYPES:
            raise MeshbenchError(f"model config: dtype must be one of {sorted(_DTYPES)}, got {self.dtype!r}")

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    @property
    def kv_dim(self) -> int:
        return self.n_kv_heads * self.head_dim

    @property
    def np_dtype(self) -> type[np.floating]:
        return _DTYPES[self.dtype]

    @property
    def itemsize(self) -> int:
        return np.dtype(self.np_dtype).itemsize

    @property
    def kv_bytes_per_token(self) -> int:
        return kv_bytes_per_token(self.n_layers, self.n_kv_heads, self.head_dim, self.itemsize)

    @property
    def n_params(self) -> int:
        per_layer = (
            2 * self.dim  # attn_norm, ffn_norm
            + self.dim * self.dim * 2  # wq, wo
            + self.kv_dim * self.dim * 2  # wk, wv
            + self.ffn_dim * self.dim * 3  # gate, up, down
        )
        return self.n_layers * per_layer + 2 * self.vocab_size * self.dim + self.dim

    def decode_flops_per_token(self) -> int:
        """Matmul FLOPs of one decode token, attention over the cache excluded."""
        return 2 * (self.n_params - self.vocab_size * self.dim)  # the embedding is a lookup

    def to_dict(self) -> dict:
        return asdict(self)


PRESETS: dict[str, ModelConfig] = {
    # 3 layers x 2 KV heads x head_dim 16 x 8 bytes x (K, V) = 1536 KV bytes per token:
    # the figure that makes the DGR-012 evidence table's peak-KV column reproduce.
    "dgr-012": ModelConfig(
        vocab_size=256,
        dim=64,
        n_layers=3,
        n_heads=4,
        n_kv_heads=2,
        ffn_dim=192,
        dtype="float64",
        context_length=512,
    ),
    # float32, ~62M parameters (~250 MB): big enough that decode is memory-bound on a CPU.
    "bench": ModelConfig(
        vocab_size=8192,
        dim=768,
        n_layers=8,
        n_heads=12,
        n_kv_heads=4,
        ffn_dim=2048,
        dtype="float32",
        context_length=2048,
    ),
}


def preset(name: str) -> ModelConfig:
    try:
        return PRESETS[name]
    except KeyError:
        raise MeshbenchError(f"unknown preset {name!r}; expected one of {', '.join(sorted(PRESETS))}") from None
