"""llama.cpp's side of a GGUF model: the library, its log (silenced, or read for the topology), the
device, the model loaded once and shared by the engines, and its tokenizer."""

from __future__ import annotations

import ctypes
import re
import sys
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Sequence

from meshbench import files, limits
from meshbench.engine import kv_geometry, rpc
from meshbench.errors import EngineUnavailable, MeshbenchError
from meshbench.model import gguf_io

GGML_TYPE_F32, GGML_TYPE_F16 = 0, 1
KV_TYPES = {"f32": (GGML_TYPE_F32, 4), "f16": (GGML_TYPE_F16, 2)}
_log_lock = threading.Lock()
_log_callback = None  # kept alive for as long as llama.cpp may call it
_captured: list[str] | None = None  # llama.cpp's log lines while a topology is being read
_echo = False  # llama.cpp's log lines also to stderr (--verbose)
LAYER_LINE = re.compile(r"layer\s+(\d+) assigned to device (\S+?),")
BUFFER_LINE = re.compile(r"^\w+:\s+(\S+) (model|KV) buffer size =\s+([\d.]+) MiB")


def llama_cpp_lib():
    """The llama_cpp module (llama-cpp-python's ctypes bindings), or EngineUnavailable."""
    try:
        import llama_cpp  # noqa: PLC0415 - optional extra

        return llama_cpp
    except Exception as e:  # ImportError, or the native library failing to load
        raise EngineUnavailable(
            f"llama-cpp-python is not usable here ({type(e).__name__}: {e}); pip install 'meshbench[gguf]'"
        ) from None


def set_llama_logging(verbose: bool) -> None:
    """Silence llama.cpp's own log lines unless ``verbose`` (then they go to stderr); either way they are read
    where a block captures them (``capture_log``: the KV allocation, the topology, flash attention's choice)."""
    global _log_callback, _echo
    lib = llama_cpp_lib()
    with _log_lock:
        _echo = verbose
        if _log_callback is None:

            @lib.llama_log_callback
            def _log(level, text, user_data):  # noqa: ARG001
                line = text.decode(errors="replace")
                if _captured is not None:
                    _captured.append(line)
                if _echo:
                    sys.stderr.write(line)

            _log_callback = _log
            lib.llama_log_set(_log_callback, ctypes.c_void_p())


@contextmanager
def capture_log():
    """Collect llama.cpp's log lines for the duration of the block."""
    global _captured
    lines: list[str] = []
    with _log_lock:
        _captured = lines
    try:
        yield lines
    finally:
        with _log_lock:
            _captured = None


def topology(lines: Sequence[str]) -> dict:
    """Which device holds which layers, and its model and KV buffers, from llama.cpp's log lines."""
    layers: dict[str, list[int]] = {}
    buffers: dict[str, dict[str, float]] = {}
    for line in "".join(lines).splitlines():
        if m := LAYER_LINE.search(line):
            layers.setdefault(m.group(2), []).append(int(m.group(1)))
        elif m := BUFFER_LINE.search(line.strip()):
            buffers.setdefault(m.group(1), {})[f"{m.group(2).lower()}_buffer_mib"] = float(m.group(3))
    return {"layers": layers, "buffers": buffers}


def resolve_device(device: str) -> str:
    llama_cpp_lib()
    # Not llama_supports_gpu_offload(): an RPC build says True there with no GPU at all.
    gpu = rpc.has_gpu_device()
    if device == "cuda" and not gpu:
        raise MeshbenchError(
            "--device cuda: the installed llama.cpp has no GPU backend (rebuild llama-cpp-python "
            "with CMAKE_ARGS=-DGGML_CUDA=on, or use --device cpu)"
        )
    if device == "auto":
        return "cuda" if gpu else "cpu"
    return device


def check_native_sizes(model: LoadedModel, n_seq_max: int, seq_capacity: int, threads: int | None) -> None:
    """Bound every number that sizes a llama.cpp context: beyond these it aborts or crashes the process."""
    if threads is not None and not 1 <= threads <= limits.MAX_THREADS:
        raise MeshbenchError(f"engine.threads {threads}: llama.cpp takes 1 to {limits.MAX_THREADS} threads")
    if not 1 <= n_seq_max <= limits.MAX_LLAMA_SEQUENCES:
        raise MeshbenchError(
            f"{n_seq_max} concurrent sessions: a llama.cpp context holds 1 to {limits.MAX_LLAMA_SEQUENCES} sequences"
        )
    if not 1 <= seq_capacity <= limits.MAX_TOKENS:
        raise MeshbenchError(
            f"{seq_capacity} positions per session: a llama.cpp sequence here holds 1 to {limits.MAX_TOKENS}"
        )


class LoadedModel:
    """A llama.cpp model loaded once and shared by the per-level engines."""

    def __init__(
        self,
        path: Path,
        device: str,
        verbose: bool,
        endpoints: Sequence[rpc.Endpoint] = (),
        split: Sequence[float] | None = None,
        repack: bool = False,
    ) -> None:
        lib = llama_cpp_lib()
        set_llama_logging(verbose)
        self.arch = gguf_io.check_model_file(path)
        self.geometry = kv_geometry.read(path)
        self.repack = repack
        self.repack_why: str | None = None  # what decided it, where engine.repack was auto (meshbench.engine.recipe)
        lib.llama_backend_init()
        self.path = path
        self.device = resolve_device(device)
        self.endpoints = list(endpoints)
        mp = lib.llama_model_default_params()
        mp.n_gpu_layers = 0 if self.device == "cpu" else 999  # cuda: every layer
        mp.use_extra_bufts = repack  # llama.cpp's CPU weight repacking (and its AMX buffers)
        if self.endpoints:  # every layer goes to the RPC workers' devices (llama.cpp's proportional split)
            self._devices, self.device_names, self.protocols = rpc.devices(self.endpoints)
            mp.devices = ctypes.addressof(self._devices)
            mp.n_gpu_layers = 999
            if split is not None:  # shares per device, in the devices' order
                self._split = (ctypes.c_float * lib.llama_max_devices())(*split)
                mp.tensor_split = self._split
        with capture_log() as lines:
            self.ptr = lib.llama_model_load_from_file(str(path).encode(), mp)
        self.load_log = lines
        if not self.ptr:
            raise MeshbenchError(
                f"model {path}: llama.cpp could not load it (architecture {self.arch!r}; "
                "truncated, corrupt, or an architecture this llama.cpp cannot run)"
            )
        self.vocab = lib.llama_model_get_vocab(self.ptr)
        self.vocab_size = int(lib.llama_vocab_n_tokens(self.vocab))
        self.n_layers = int(lib.llama_model_n_layer(self.ptr))
        self.n_embd = int(lib.llama_model_n_embd(self.ptr))
        self.n_head = int(lib.llama_model_n_head(self.ptr))
        self.n_head_kv = int(lib.llama_model_n_head_kv(self.ptr))
        self.n_ctx_train = int(lib.llama_model_n_ctx_train(self.ptr))
        self.weight_bytes = int(lib.llama_model_size(self.ptr))
        self.n_swa = int(lib.llama_model_n_swa(self.ptr))
        self.eog = tuple(t for t in range(self.vocab_size) if lib.llama_vocab_is_eog(self.vocab, t))
        self.name = _meta(lib, self.ptr, "general.name")
        self.sha256 = files.sha256(path)
        assert len(self.geometry.layers) == self.n_layers, (len(self.geometry.layers), self.n_layers)

    def kv_bytes_per_token(self, kv_type: str) -> int:
        """K and V of every layer for one position, from the model's own geometry (key/value lengths and
        KV heads per layer): llama.cpp's default full-size sliding-window cache stores every position."""
        return self.geometry.bytes_per_token(KV_TYPES[kv_type][1])

    def close(self) -> None:
        if self.ptr:
            llama_cpp_lib().llama_model_free(self.ptr)
            self.ptr = None


def _meta(lib, ptr, key: str) -> str | None:
    buf = ctypes.create_string_buffer(256)
    n = lib.llama_model_meta_val_str(ptr, key.encode(), buf, len(buf))
    return buf.value.decode(errors="replace") if n >= 0 else None


KV_CACHE_HEADER = re.compile(r"creating\s+(non-SWA|SWA) KV cache")
KV_LAYER_LINE = re.compile(r"llama_kv_cache: layer\s+(\d+): dev = ")
KV_SIZE_LINE = re.compile(
    r"llama_kv_cache: size =\s+[\d.]+ MiB \(\s*(\d+) cells,\s*(\d+) layers,\s*\d+/(\d+) seqs\)"
    r".*K \((\w+)\):\s+([\d.]+) MiB, V \((\w+)\):\s+([\d.]+) MiB"
)


def kv_cache_log(lines: Sequence[str]) -> dict:
    """What llama.cpp says it allocated for a context's KV cache, from its log: the sliding-window layers
    (the layers of its SWA cache, when it has one) and, per cache, cells, layers and K/V MiB."""
    swa: list[int] = []
    caches = []
    current = None
    for line in "".join(lines).splitlines():
        if m := KV_CACHE_HEADER.search(line):
            current = m.group(1)
        elif (m := KV_LAYER_LINE.search(line)) and current == "SWA":
            swa.append(int(m.group(1)))
        elif m := KV_SIZE_LINE.search(line):
            # cells are per stream: without kv_unified each sequence has a stream of its own
            caches.append(
                {
                    "cache": current or "base",
                    "cells": int(m.group(1)) * int(m.group(3)),
                    "layers": int(m.group(2)),
                    "k_mib": float(m.group(5)),
                    "v_mib": float(m.group(7)),
                }
            )
    return {"swa_layers": swa, "caches": caches}


def tokenize(
    path: str, texts: Sequence[str], bos: bool = True, special: bool = False, check_file: bool = True
) -> list[tuple[int, ...]]:
    """Each text's token ids by the model's own tokenizer (BOS added as the model says, unless ``bos`` is false:
    a text that continues another; special-token text read as those tokens where ``special``, as llama-server's
    ``/tokenize`` and llama-cpp-python's server's ``/extras/tokenize`` read it, else as plain characters). A model
    without a vocabulary is refused here: llama.cpp aborts the process when asked to tokenize with none. The file's
    weights are checked first (gguf_io.check_model_file) unless ``check_file`` is false: a file whose sha256 was
    checked already (a packaged model)."""
    lib = llama_cpp_lib()
    set_llama_logging(False)
    model_path = files.regular_file(path, "model")
    if check_file:
        gguf_io.check_model_file(model_path)
    lib.llama_backend_init()
    mp = lib.llama_model_default_params()
    mp.vocab_only = True
    ptr = lib.llama_model_load_from_file(str(model_path).encode(), mp)
    if not ptr:
        raise MeshbenchError(f"model {path}: llama.cpp could not read its vocabulary")
    try:
        vocab = lib.llama_model_get_vocab(ptr)
        if lib.llama_vocab_type(vocab) == lib.LLAMA_VOCAB_TYPE_NONE:
            raise MeshbenchError(
                f"model {path} has no tokenizer (vocabulary type none): real prompts need one "
                "(meshbench model make-tiny --preset bench writes one)"
            )
        return [_tokenize(lib, vocab, text, bos, special) for text in texts]
    finally:
        lib.llama_model_free(ptr)


def _tokenize(lib, vocab, text: str, bos: bool = True, special: bool = False) -> tuple[int, ...]:
    raw = text.encode()
    size = len(raw) + 8
    buf = (lib.llama_token * size)()
    n = lib.llama_tokenize(vocab, raw, len(raw), buf, size, bos, special)
    if n < 0:  # the buffer was too small: -n is the size needed
        buf = (lib.llama_token * -n)()
        n = lib.llama_tokenize(vocab, raw, len(raw), buf, -n, bos, special)
    if n <= 0:
        raise MeshbenchError(f"prompt {text[:40]!r}: the tokenizer gave no tokens")
    return tuple(buf[:n])
