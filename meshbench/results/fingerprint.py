"""The compute fingerprint: what selects the kernels a result's floating-point figures came from.

Two machines with the same fingerprint run the same kernels on the same data, so every float they
record must agree bit for bit; on different fingerprints, summation order and fused multiply-adds
may differ, and floats agree only within a tolerance (``meshbench.verify.reproduce``). The CPU's
model, the SIMD flags that select kernels, numpy's BLAS with the kernel it runs (threadpoolctl),
``OPENBLAS_CORETYPE``, and llama.cpp's build with the backend features it reports.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re

from meshbench.machine import KERNEL_FLAGS, cpu_model, llama_cpp_build, simd_flags  # noqa: F401 - re-exported
from meshbench.records import serial
from meshbench.records.context import Blas, Compute, LlamaCppBuild


def blas() -> Blas | None:
    """numpy's BLAS as threadpoolctl sees it loaded: library, version, the kernel it runs, threads."""
    try:
        import numpy  # noqa: F401, PLC0415 - loads the BLAS threadpoolctl inspects
        from threadpoolctl import threadpool_info  # noqa: PLC0415
    except ImportError:
        return None
    libs = [lib for lib in threadpool_info() if lib.get("user_api") == "blas"]
    # numpy's own, whichever other library (scipy's) was loaded before it: the one the synthetic engine runs
    libs.sort(key=lambda lib: "numpy" not in str(lib.get("filepath", "")))
    for lib in libs[:1]:
        version, kernel = lib.get("version"), lib.get("architecture")
        return Blas(
            library=str(lib.get("internal_api")),
            version=None if version is None else str(version),
            kernel=None if kernel is None else str(kernel),
            threads=int(lib.get("num_threads") or 0),
        )
    return None


def llama_kernels(fp: Compute | None) -> str | None:
    """llama.cpp's CPU kernel family on a fingerprint: its version and the CPU features its build reports on
    (``AVX2 = 1`` in system_info), e.g. ``0.3.36: AVX AVX2 AVX512 ...``; None without llama.cpp.

    A quantized model's tokens are bound to it, not to the CPU model: AVX2 and AVX-512 builds sum the same
    Q4_K dot products in other orders, and Gemma 3 270M's greedy tokens differ between them from the first
    token on, at margins up to 2.2 (an AVX2 AMD EPYC against the AVX-512 ones its bundles were made on)."""
    build = None if fp is None else fp.llama_cpp
    if build is None:
        return None
    return f"{build.version}: {' '.join(_features_on(build.system_info)) or 'no CPU features reported'}"


_WIDTHS = (("AVX512", 512), ("AVX2", 256), ("AVX", 128))


def vector_bits(family: str | None) -> int:
    """The widest vector unit a kernel family (``llama_kernels``) reports: 512 (AVX512), 256 (AVX2), 128 (AVX),
    else 0. llama.cpp writes its quantized dot products once per width, and a quantized model's greedy tokens
    differ between AVX2 and AVX-512 kernels (docs/concepts/determinism.md); kernels of one width that differ
    in a lesser feature (AVX_VNNI) have reproduced every record. A CPU narrower than a bundle's kernels cannot
    run them: its rerun cannot confirm the tokens."""
    features = set((family or "").partition(": ")[2].split())
    return next((bits for name, bits in _WIDTHS if name in features), 0)


def _features_on(system_info: str) -> list[str]:
    """The features a build's system_info reports on (``AVX2 = 1``), sorted, each once."""
    return sorted(set(_ON.findall(system_info)))


# llama.cpp's system_info words, and the CPU flag (as /proc/cpuinfo names it) each needs to run at all.
_RUNS_ON = {
    "AVX": "avx", "AVX2": "avx2", "FMA": "fma", "F16C": "f16c", "SSSE3": "ssse3", "AVX_VNNI": "avx_vnni",
    "AVX512": "avx512f", "AVX512_VBMI": "avx512vbmi", "AVX512_VNNI": "avx512_vnni", "AVX512_BF16": "avx512_bf16",
    "AMX_INT8": "amx_int8",
}  # fmt: skip
_VERSION = re.compile(r"\d+(\.\d+)+([.+-][0-9A-Za-z.]+)?")
_ON = re.compile(r"([A-Z][A-Z0-9_]*) = 1\b")


def contradictions(fp: Compute) -> list[str]:
    """What a fingerprint says of llama.cpp that the rest of it contradicts: a version that is not one, or
    kernels its own CPU's flags could not run (a build for features the CPU lacks dies at its first use)."""
    build = fp.llama_cpp
    if build is None:
        return []
    out = []
    if not _VERSION.fullmatch(build.version):
        out.append(f"llama.cpp version {ascii(build.version)} is not a version")
    info = build.system_info
    if not info.isascii() or not info.isprintable():
        out.append("llama.cpp system_info holds characters no build prints")
    simd = set(fp.simd)
    if simd:  # (empty where /proc/cpuinfo could not be read: nothing to hold it to)
        out += [
            f"llama.cpp reports {w} on a CPU without {_RUNS_ON[w]}"
            for w in _ON.findall(info)
            if w in _RUNS_ON and _RUNS_ON[w] not in simd
        ]
    return out


def fingerprint() -> Compute:
    """This machine's compute fingerprint, its digest over the rest of it as results.json writes it."""
    build = llama_cpp_build()
    fp = Compute(
        cpu=cpu_model(),
        simd=simd_flags(),
        blas=blas(),
        openblas_coretype=os.environ.get("OPENBLAS_CORETYPE"),
        llama_cpp=None if build is None else LlamaCppBuild(version=build["version"], system_info=build["system_info"]),
        digest="",
    )
    return dataclasses.replace(fp, digest=digest(fp))


def digest(fp: Compute) -> str:
    """sha256 over every field but the digest itself, as results.json writes them: equal digests, same kernels."""
    body = {k: v for k, v in serial.to_json(fp).items() if k != "digest"}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def describe(fp: Compute | None) -> str:
    """One phrase a reader can place: the CPU, and the BLAS kernel where there is one."""
    if fp is None:
        return "an unrecorded machine"
    kernel = None if fp.blas is None else fp.blas.kernel
    return fp.cpu + (f" (BLAS kernel {kernel})" if kernel else "")
