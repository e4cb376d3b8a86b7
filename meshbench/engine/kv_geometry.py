"""A model's KV geometry, layer by layer, from its own GGUF metadata: what one token costs in the cache.

head_dim = n_embd / n_head holds for llama but not for every architecture (Gemma 3 270M: n_embd 640,
4 heads, but keys and values of 256), so the K and V lengths are read from ``{arch}.attention.
key_length`` / ``value_length`` where the file gives them, exactly as llama.cpp reads them. KV heads
may be one number or one per layer. A sliding-window layer's window comes from llama.cpp (which of
the layers use it is architecture code there, not metadata): see ``with_windows``.

With llama.cpp's default ``swa_full`` every layer, sliding or not, keeps a cell for every position, so
the allocated cost per token is the sum over all layers; the window only bounds what a windowed cache
would need (``window_bound_bytes``), reported beside it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Sequence

from meshbench.errors import MeshbenchError


@dataclass(frozen=True, slots=True)
class LayerKv:
    """One layer's cache per token: K and V values (KV heads x their lengths), and its window (None: all)."""

    k_values: int
    v_values: int
    window: int | None = None


@dataclass(frozen=True, slots=True)
class KvGeometry:
    architecture: str
    layers: tuple[LayerKv, ...]

    def bytes_per_token(self, itemsize: int) -> int:
        """K and V of every layer for one position: what a cache that stores every position holds."""
        return sum(layer.k_values + layer.v_values for layer in self.layers) * itemsize

    def window_bound_bytes(self, tokens: int, itemsize: int) -> int:
        """What ``tokens`` positions need when each sliding layer keeps only its window."""
        return (
            sum(
                (layer.k_values + layer.v_values) * (tokens if layer.window is None else min(tokens, layer.window))
                for layer in self.layers
            )
            * itemsize
        )

    def with_windows(self, window: int, sliding: Sequence[int]) -> "KvGeometry":
        """The geometry with ``window`` on the layers llama.cpp runs as sliding-window layers."""
        on = set(sliding)
        return replace(
            self,
            layers=tuple(replace(layer, window=window if i in on else None) for i, layer in enumerate(self.layers)),
        )

    def to_dict(self, itemsize: int) -> dict:
        return {
            "architecture": self.architecture,
            "layers": len(self.layers),
            "k_values": [layer.k_values for layer in self.layers],
            "v_values": [layer.v_values for layer in self.layers],
            "window": [layer.window for layer in self.layers],
            "bytes_per_token": self.bytes_per_token(itemsize),
        }


MAX_LAYERS = 4096  # far above any model's block_count; bounds what a file can make us allocate
MAX_DIM = 1 << 20  # an embedding, a head count or a key length


def _count(value, key: str, low: int = 1, high: int = MAX_DIM) -> int:
    """A metadata count: an integer within [low, high], or a MeshbenchError naming the key."""
    if hasattr(value, "item") and not isinstance(value, (list, tuple)):
        value = value.item()  # (a numpy scalar, as the gguf package reads them)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise MeshbenchError(f"model: GGUF metadata {key} is {value!r}: need an integer in [{low}, {high}]")
    return value


def _per_layer(value, n_layers: int, key: str, low: int = 1) -> list[int]:
    """A metadata value that is one number for every layer, or one per layer."""
    if isinstance(value, (list, tuple)):
        if len(value) != n_layers:
            raise MeshbenchError(f"model: GGUF metadata {key} has {len(value)} values for {n_layers} layers")
        return [_count(v, key, low) for v in value]
    return [_count(value, key, low)] * n_layers


def from_metadata(meta: dict) -> KvGeometry:
    """The geometry from GGUF metadata keys (``general.architecture`` and the ``{arch}.`` hyperparameters),
    with llama.cpp's defaults where a key is absent: KV heads = heads, key length = embedding / heads,
    value length = key length. A key llama.cpp needs and the file lacks is a MeshbenchError."""
    try:
        return _from_metadata(meta)
    except KeyError as e:
        raise MeshbenchError(f"model: GGUF metadata {e.args[0]} is missing (needed for the KV geometry)") from None


def _from_metadata(meta: dict) -> KvGeometry:
    arch = meta["general.architecture"]
    p = f"{arch}."
    n_layers = _count(meta[p + "block_count"], p + "block_count", 1, MAX_LAYERS)
    heads = _per_layer(meta[p + "attention.head_count"], n_layers, p + "attention.head_count")
    # (a layer of no KV heads is one llama.cpp keeps no cache for: some hybrid models have them)
    kv_heads = _per_layer(meta.get(p + "attention.head_count_kv", heads), n_layers, p + "attention.head_count_kv", 0)
    embd = _count(meta[p + "embedding_length"], p + "embedding_length")
    # llama.cpp's default key length is the embedding over layer 0's head count (hparams.n_head(0)), not the largest
    key = _count(meta.get(p + "attention.key_length", embd // heads[0]), p + "attention.key_length")
    value = _count(meta.get(p + "attention.value_length", key), p + "attention.value_length")
    return KvGeometry(arch, tuple(LayerKv(h * key, h * value) for h in kv_heads))


def read(path: Path) -> KvGeometry:
    """The geometry of a GGUF file (the gguf package reads its metadata, once per process: gguf_io.checked_model)."""
    from meshbench.model import gguf_io  # noqa: PLC0415 - the gguf package is an optional extra

    return from_metadata(gguf_io.checked_model(path).meta)
