"""GGUF files of the synthetic model: write them (make-tiny) and read their weights back.

The file holds exactly the synthetic engine's deterministic weights in llama.cpp's
``llama`` architecture, so the synthetic engine and llama.cpp run the same numbers.
Facts this relies on (measured here): llama.cpp needs the hyperparameters below and a
tokenizer model; ``tokenizer.ggml.model = "none"`` with a vocab_size works when token
ids are fed directly (llama_tokenize on such a vocab aborts the process: never call it).
Quantized rows must be a multiple of 32 values.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from pathlib import Path

import numpy as np

from meshbench.errors import EngineUnavailable, MeshbenchError
from meshbench.files import regular_file, sha256, umask_mode
from meshbench.model import vocab
from meshbench.model.config import ModelConfig
from meshbench.model.weights import Weights

TYPES = ("f32", "f16", "q8_0", "q4_0")
ARCH = "llama"


def _gguf():
    try:
        import gguf  # noqa: PLC0415 - optional extra

        return gguf
    except ImportError:
        raise EngineUnavailable("the gguf package is not installed: pip install 'meshbench[gguf]'") from None


WRITER_VERSION = 2  # 2: a llama vocabulary (model.vocab) in every preset that has room for one


def _add_vocab(w, vocab_size: int) -> None:
    """A llama (SentencePiece) vocabulary when the preset has room for one, else none (model.vocab)."""
    if vocab_size < vocab.MIN_VOCAB:
        w.add_tokenizer_model("none")
        return
    tokens, scores, types = vocab.pieces(vocab_size)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_unk_token_id(vocab.UNK)
    w.add_bos_token_id(vocab.BOS)
    w.add_eos_token_id(vocab.EOS)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)


def write(path: Path, cfg: ModelConfig, weights: Weights, qtype: str = "f32", name: str = "meshbench-tiny") -> int:
    """Write a llama-architecture GGUF atomically; returns its size in bytes."""
    gguf = _gguf()
    if qtype not in TYPES:
        raise MeshbenchError(f"--type must be one of {', '.join(TYPES)}, got {qtype!r}")
    Q = gguf.GGMLQuantizationType
    tensor_type = {"f32": Q.F32, "f16": Q.F16, "q8_0": Q.Q8_0, "q4_0": Q.Q4_0}[qtype]
    if qtype in ("q8_0", "q4_0"):
        bad = sorted({a.shape[1] for _, a in weights.named_tensors() if a.ndim == 2 and a.shape[1] % 32})
        if bad:
            raise MeshbenchError(f"--type {qtype}: rows of {bad[0]} values are not a multiple of 32")
    path = Path(path)
    try:
        fd, tmp = tempfile.mkstemp(prefix=".meshbench-model-", suffix=".tmp", dir=path.parent or ".")
    except OSError as e:
        raise MeshbenchError(f"{path}: cannot create a file there ({e.strerror})") from None
    os.close(fd)
    try:
        w = gguf.GGUFWriter(tmp, ARCH)
        w.add_name(name)
        w.add_context_length(cfg.context_length)
        w.add_embedding_length(cfg.dim)
        w.add_block_count(cfg.n_layers)
        w.add_feed_forward_length(cfg.ffn_dim)
        w.add_head_count(cfg.n_heads)
        w.add_head_count_kv(cfg.n_kv_heads)
        w.add_layer_norm_rms_eps(cfg.norm_eps)
        w.add_rope_freq_base(cfg.rope_theta)
        w.add_rope_dimension_count(cfg.head_dim)
        w.add_vocab_size(cfg.vocab_size)
        _add_vocab(w, cfg.vocab_size)
        w.add_file_type({"f32": 0, "f16": 1, "q8_0": 7, "q4_0": 2}[qtype])
        for tname, arr in weights.named_tensors():
            a = np.ascontiguousarray(arr, dtype=np.float32)
            if a.ndim == 1 or qtype == "f32":
                w.add_tensor(tname, a)  # norms stay F32, as llama.cpp's converters keep them
            elif qtype == "f16":
                w.add_tensor(tname, a.astype(np.float16))
            else:
                w.add_tensor(tname, gguf.quants.quantize(a, tensor_type), raw_dtype=tensor_type)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        os.chmod(tmp, umask_mode(0o666))  # mkstemp makes 0600: a model file is as readable as any other
        os.replace(tmp, path)
    except OSError as e:
        Path(tmp).unlink(missing_ok=True)
        raise MeshbenchError(f"{path}: cannot write the model ({e.strerror or e}); nothing was written") from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path.stat().st_size


# Bytes per block, and where its float16 scale sits: a block's values are scale x int.
_BLOCKS = {"Q8_0": 34, "Q4_0": 18}


def _non_finite(gguf, t) -> int:
    """How many values of tensor ``t`` are NaN or Inf (quantized blocks: a non-finite scale)."""
    name = t.tensor_type.name
    if name in ("F32", "F16"):
        return int(np.size(t.data) - np.count_nonzero(np.isfinite(t.data)))
    if name in _BLOCKS:
        raw = np.ascontiguousarray(t.data).view(np.uint8).reshape(-1, _BLOCKS[name])  # (blocks, block bytes)
        scales = np.ascontiguousarray(raw[:, :2]).view(np.float16)  # (blocks, 1)
        return int(np.size(scales) - np.count_nonzero(np.isfinite(scales)))
    values = gguf.quants.dequantize(t.data, t.tensor_type)
    return int(np.size(values) - np.count_nonzero(np.isfinite(values)))


def check_finite(reader, path: Path) -> None:
    """Refuse a model whose weights hold NaN or Inf: every token would be argmax of garbage."""
    gguf = _gguf()
    for t in reader.tensors:
        try:
            bad = _non_finite(gguf, t)
        except (NotImplementedError, ValueError):  # a type gguf-py cannot read: the logits check stays
            continue
        if bad:
            raise MeshbenchError(
                f"model {path}: tensor {t.name} holds {bad} non-finite values (NaN or Inf); refusing to load it"
            )


def open_reader(path: Path):
    """A GGUFReader over a regular file, or a MeshbenchError saying why not."""
    gguf = _gguf()
    path = regular_file(path, "model")
    with path.open("rb") as fh:
        magic = fh.read(4)
    if magic != b"GGUF":
        raise MeshbenchError(f"model {path}: not a GGUF file (magic {magic!r}, expected b'GGUF')")
    try:
        return gguf.GGUFReader(path)
    except Exception as e:  # the reader raises ValueError, struct errors, ... on a bad file
        raise MeshbenchError(f"model {path}: corrupt or truncated GGUF ({type(e).__name__}: {e})") from None


@dataclasses.dataclass(frozen=True)
class CheckedModel:
    """What one read of a model file that passed ``check_model_file`` gives: its architecture and its metadata
    (every key but the tokenizer's arrays)."""

    arch: str
    meta: dict


# Files that passed, by the sha256 of their bytes: a sweep and its rerun load one model several times (the node, its
# tokenizer, the KV geometry), and gguf-py reads Gemma 3's 262144-token vocabulary in about 11 s each time. Keyed by
# content, never by path or mtime: a file rewritten in place, however soon, is read again. Refusals are not kept.
_CHECKED: dict[str, CheckedModel] = {}


def checked_model(path: Path) -> CheckedModel:
    """Refuse what llama.cpp must not see (not GGUF, corrupt, non-finite weights); the file's architecture and
    metadata, read once per process for each content."""
    path = regular_file(path, "model")
    digest = sha256(path)
    if digest in _CHECKED:
        return _CHECKED[digest]
    reader = open_reader(path)
    check_finite(reader, path)
    meta = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("tokenizer.")}
    checked = CheckedModel(str(meta.get("general.architecture", "unknown")), meta)
    if sha256(path) == digest:  # (kept only if the file checked is the file hashed: none replaced it meanwhile)
        _CHECKED[digest] = checked
    return checked


def check_model_file(path: Path) -> str:
    """Refuse what llama.cpp must not see (not GGUF, corrupt, non-finite weights); returns the architecture."""
    return checked_model(path).arch


def _field(reader, key: str, default=None):
    f = reader.fields.get(key)
    if f is None:
        if default is not None:
            return default
        raise MeshbenchError(f"model: GGUF metadata {key} is missing")
    return f.contents()


def _number(reader, key: str, kind: type, default=None):
    """A metadata number of ``kind`` (an int, or a float that may be given as an int), never a list or a string:
    the one-line refusal names the key."""
    v = _field(reader, key, default)
    if hasattr(v, "item") and not isinstance(v, (list, tuple)):
        v = v.item()
    ok = isinstance(v, (int, float) if kind is float else int) and not isinstance(v, bool)
    if not ok or v < 0:
        raise MeshbenchError(f"model: GGUF metadata {key} is {v!r}, not a {kind.__name__} >= 0")
    return kind(v)


def read_weights(path: Path) -> tuple[ModelConfig, Weights]:
    """The config and float32 weights of a llama-architecture GGUF (F32, F16, Q8_0, Q4_0)."""
    gguf = _gguf()
    path = Path(path)
    reader = open_reader(path)
    check_finite(reader, path)
    arch = _field(reader, "general.architecture")
    if arch != ARCH:
        raise MeshbenchError(f"model {path}: architecture {arch!r} is not supported (only {ARCH!r})")
    p = f"{ARCH}."
    n_heads = _number(reader, p + "attention.head_count", int)
    dim = _number(reader, p + "embedding_length", int)
    tensors = {}
    Q = gguf.GGMLQuantizationType
    for t in reader.tensors:
        if t.tensor_type not in (Q.F32, Q.F16, Q.Q8_0, Q.Q4_0):
            raise MeshbenchError(f"model {path}: tensor {t.name} has type {t.tensor_type.name}, not supported")
        data = gguf.quants.dequantize(t.data, t.tensor_type)
        shape = tuple(int(x) for x in reversed(t.shape.tolist()))  # GGUF ne0 is the innermost (in) axis
        tensors[t.name] = np.asarray(data, dtype=np.float32).reshape(shape)
    vocab = tensors["token_embd.weight"].shape[0] if "token_embd.weight" in tensors else None
    cfg = ModelConfig(
        vocab_size=_number(reader, p + "vocab_size", int, vocab),
        dim=dim,
        n_layers=_number(reader, p + "block_count", int),
        n_heads=n_heads,
        n_kv_heads=_number(reader, p + "attention.head_count_kv", int, n_heads),
        ffn_dim=_number(reader, p + "feed_forward_length", int),
        rope_theta=_number(reader, p + "rope.freq_base", float, 10000.0),
        norm_eps=_number(reader, p + "attention.layer_norm_rms_epsilon", float),
        dtype="float32",
        context_length=_number(reader, p + "context_length", int),
    )
    try:
        return cfg, Weights.from_named(cfg, tensors)
    except KeyError as e:
        raise MeshbenchError(f"model {path}: tensor {e.args[0]} is missing") from None
    except ValueError as e:
        raise MeshbenchError(f"model {path}: tensor shapes do not match the metadata ({e})") from None
