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


def _per_layer(value, n_layers: int) -> list[int]:
    """A metadata value that is one number for every layer, or one per layer."""
    if isinstance(value, (list, tuple)):
        assert len(value) == n_layers, (len(value), n_layers)
        return [int(v) for v in value]
    return [int(value)] * n_layers


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
    n_layers = int(meta[p + "block_count"])
    heads = _per_layer(meta[p + "attention.head_count"], n_layers)
    kv_heads = _per_layer(meta.get(p + "attention.head_count_kv", heads), n_layers)
    embd = int(meta[p + "embedding_length"])
    key = int(meta.get(p + "attention.key_length", embd // max(heads)))
    value = int(meta.get(p + "attention.value_length", key))
    return KvGeometry(arch, tuple(LayerKv(h * key, h * value) for h in kv_heads))


def read(path: Path) -> KvGeometry:
    """The geometry of a GGUF file (the gguf package reads its metadata)."""
    from meshbench.model import gguf_io  # noqa: PLC0415 - the gguf package is an optional extra

    reader = gguf_io.open_reader(path)
    meta = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("tokenizer.")}
    return from_metadata(meta)
