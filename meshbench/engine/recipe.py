"""llama.cpp's machine-dependent recipe choices, resolved on this machine: weight repacking and flash attention.

Each is ``true``, ``false`` or ``auto``. ``auto`` is llama.cpp's own default where it runs here, as a user of
llama-server gets it: repacking (``use_extra_bufts``) exactly where its repacked kernels run on this CPU, probed
once per model and machine in a throwaway process (its AMX kernels die with SIGILL on CPUs that report AMX they
cannot run) and the answer cached by the CPU's fingerprint; flash attention as llama.cpp's
``LLAMA_FLASH_ATTN_TYPE_AUTO`` decides for the model and device, read from its log. What was used is the engine
record's ``repack`` and ``flash_attn`` (and so the recipe fingerprint's), what decided each auto its ``recipe_auto``.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from meshbench import files, machine
from meshbench.engine.spec import AUTO, RECIPE_CHOICE  # noqa: F401 - the settings' values, re-exported
from meshbench.errors import MeshbenchError

REPACK_PROBE_TIMEOUT_S = 300
PROBE_FORMAT = 1  # the cache files' format: a file of another is probed again
DECODE_FAILED = 3  # the probe's exit code where llama_decode itself failed (any other is not an answer to cache)
WHY_MAX = 120
# llama.cpp's word on flash_attn_type auto (llama_context's resolve_fused_ops): "Flash Attention enabled", or
# "Flash Attention not supported, set to disabled" where a layer's device cannot run it
_FLASH_ATTN_LINE = re.compile(r"Flash Attention (enabled|disabled|not supported, set to disabled)")
_CRASHES = frozenset({"SIGILL", "SIGSEGV", "SIGBUS", "SIGFPE", "SIGABRT"})  # a probe's death that is the kernels'


@dataclass(frozen=True)
class Probe:
    """The repack probe's answer: why llama.cpp's repacked kernels failed here (None: they ran), and whether that is
    an answer about the kernels (they ran, llama_decode failed, the process died of a crash signal: cached), not a
    probe that timed out or was stopped from outside (asked again in the next process)."""

    why: str | None
    final: bool

    @property
    def kernels_die(self) -> bool:
        """The probe's verdict that the repacked kernels cannot run here."""
        return self.final and self.why is not None


_repack_failure: dict[str, Probe] = {}  # cache key -> the probe's answer for that model and machine


class RepackRefused(MeshbenchError):
    """engine.repack true where llama.cpp's repacked kernels do not run on this machine."""

    def __init__(self, why: str) -> None:
        super().__init__(
            f"engine.repack true: llama.cpp's repacked CPU kernels {why} on this machine in a 16-token probe "
            "of this model in a throwaway process; use engine.repack false (or auto)"
        )
        self.why = why


def repack(setting: bool | str, path: Path) -> tuple[bool, str | None]:
    """Whether the engine repacks its weights, and (for ``auto``) what decided it. ``true`` where the repacked
    kernels die here is refused in one line; ``auto`` then runs without them and says why."""
    if setting is False:
        return False, None
    why = repack_failure(path).why
    if setting is True:
        if why is not None:
            raise RepackRefused(why)
        return True, None
    if why is None:
        return True, "on: llama.cpp's repacked kernels ran a probe of this model on this CPU"
    return False, f"off: llama.cpp's repacked kernels {why} on this CPU in a probe of this model"


def flash_attn_type(lib, setting: bool | str) -> int:
    """llama_context_params.flash_attn_type for a setting."""
    if setting == AUTO:
        return int(lib.LLAMA_FLASH_ATTN_TYPE_AUTO)
    return int(lib.LLAMA_FLASH_ATTN_TYPE_ENABLED if setting else lib.LLAMA_FLASH_ATTN_TYPE_DISABLED)


def flash_attn_chosen(context_log: Sequence[str]) -> bool:
    """What llama.cpp chose for ``flash_attn_type`` auto, from the log of the context it was given to."""
    found = _FLASH_ATTN_LINE.findall("".join(context_log))
    if not found:
        raise MeshbenchError(
            "engine.flash_attn auto: llama.cpp's log did not say whether it enabled flash attention (a llama.cpp "
            "this meshbench does not know); set engine.flash_attn true or false"
        )
    return found[-1] == "enabled"


def repack_failure(path: Path) -> Probe:
    """Whether llama.cpp's repacked kernels fail on this machine for this model, and why, probed once per model and
    machine: in memory, then in meshbench's cache keyed by the CPU's fingerprint and llama.cpp's build."""
    key = probe_key(path)
    if key not in _repack_failure:
        cached = _read_cached(key)
        if cached is None:
            cached = Probe(*_probe(str(path)))
            if cached.final:  # (a timeout or a probe that could not start says nothing of the kernels: asked again)
                _write_cached(key, {"why": cached.why})
        _repack_failure[key] = cached
    return _repack_failure[key]


def probe_key(path: Path) -> str:
    """The model's bytes, the CPU (model and kernel-selecting flags), what runs under it (the OS kernel grants a
    process AMX's tile state, and a hypervisor may withhold it: the same CPU can run a kernel in one and not in
    the other) and llama.cpp's build with its features."""
    here = {
        "cpu": machine.cpu_model(),
        "simd": machine.simd_flags(),
        "os": machine.os_kernel(),
        "hypervisor": machine.under_hypervisor(),
        "llama_cpp": machine.llama_cpp_build(),
        "model_sha256": _model_sha256(path),
    }
    return hashlib.sha256(json.dumps(here, sort_keys=True).encode()).hexdigest()


_hashed: dict[tuple[str, int, int], str] = {}  # (path, size, mtime) -> sha256: a model hashed once per process


def _model_sha256(path: Path) -> str:
    """The model's sha256, hashed again only when the file changed (a rerun asks before its sweep does)."""
    st = path.stat()
    key = (str(path), st.st_size, st.st_mtime_ns)
    if key not in _hashed:
        _hashed[key] = files.sha256(path)
    return _hashed[key]


def _cache_file(key: str) -> Path:
    return files.cache_dir() / "probes" / f"repack-{key}.json"


def _read_cached(key: str) -> Probe | None:
    """A cached answer, or None where there is none or it is not one (a damaged file is probed again)."""
    try:
        data = json.loads(_cache_file(key).read_text())
    except (OSError, ValueError, RecursionError):
        return None
    if not (isinstance(data, dict) and data.get("format") == PROBE_FORMAT and data.get("key") == key):
        return None
    why = data.get("why", 0)
    if why is None or (isinstance(why, str) and why.isprintable() and 0 < len(why) <= WHY_MAX):
        return Probe(why, final=True)  # (only final answers are written)
    return None


def _write_cached(key: str, answer: dict) -> None:
    """Whole or not at all (a temporary file renamed over it); a cache that cannot be written is no error."""
    target = _cache_file(key)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        files.write_atomically(target, json.dumps({"format": PROBE_FORMAT, "key": key, **answer}), f".{target.name}.")
    except OSError:
        pass


def _probe(path: str) -> tuple[str | None, bool]:
    """Why the repacked kernels failed in a throwaway process (None: they ran), and whether that is an answer
    about the kernels (they ran, llama_decode failed, or the process died of a signal) to be cached."""
    env = dict(os.environ, GGML_NO_BACKTRACE="1")
    try:
        code = subprocess.run(
            [
                sys.executable,
                "-c",
                "import sys; from meshbench.engine.recipe import repack_probe; repack_probe(sys.argv[1])",
                path,
            ],
            env=env,
            timeout=REPACK_PROBE_TIMEOUT_S,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        ).returncode
    except subprocess.TimeoutExpired:
        return f"did not finish within {REPACK_PROBE_TIMEOUT_S} s", False
    if code == 0:
        return None, True
    if code == DECODE_FAILED:
        return "failed to decode (llama_decode)", True
    if code > 0:
        return f"exited {code}", False
    try:
        name = signal.Signals(-code).name
    except ValueError:
        return f"was stopped by signal {-code}", False
    if name in _CRASHES:  # (the kernels' own fault: an illegal instruction, a bad access, an abort)
        return f"died with {name}", True
    return f"was stopped by {name}", False  # (killed from outside, out of memory say: nothing of the kernels)


def repack_probe(path: str) -> None:
    """A throwaway process's one decode of 16 tokens with repacking on (``repack_failure``)."""
    from meshbench.engine.llama_model import llama_cpp_lib, set_llama_logging  # noqa: PLC0415

    lib = llama_cpp_lib()
    set_llama_logging(False)
    lib.llama_backend_init()
    mp = lib.llama_model_default_params()
    mp.use_extra_bufts = True
    model = lib.llama_model_load_from_file(path.encode(), mp)
    cp = lib.llama_context_default_params()
    cp.n_ctx, cp.n_batch, cp.n_ubatch = 256, 32, 32
    ctx = lib.llama_init_from_model(model, cp)
    tokens = (lib.llama_token * 16)(*([1] * 16))  # kept alive: the batch holds only a pointer to it
    batch = lib.llama_batch_get_one(tokens, 16)
    sys.exit(0 if lib.llama_decode(ctx, batch) == 0 else DECODE_FAILED)
