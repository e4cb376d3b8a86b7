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
from typing import Any

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


def llama_kernels(fp: dict[str, Any] | None) -> str | None:
    """llama.cpp's CPU kernel family on a fingerprint: its version and the CPU features its build reports on
    (``AVX2 = 1`` in system_info), e.g. ``0.3.36: AVX AVX2 AVX512 ...``; None without llama.cpp.

    A quantized model's tokens are bound to it, not to the CPU model: AVX2 and AVX-512 builds sum the same
    Q4_K dot products in other orders, and Gemma 3 270M's greedy tokens differ between them from the first
    token on, at margins up to 2.2 (an AVX2 AMD EPYC against the AVX-512 ones its bundles were made on)."""
    build = (fp or {}).get("llama_cpp")
    if not build:
        return None
    on = sorted(set(re.findall(r"([A-Z][A-Z0-9_]*) = 1\b", str(build.get("system_info", "")))))
    return f"{build.get('version')}: {' '.join(on) or 'no CPU features reported'}"


# llama.cpp's system_info words, and the CPU flag (as /proc/cpuinfo names it) each needs to run at all.
_RUNS_ON = {
    "AVX": "avx", "AVX2": "avx2", "FMA": "fma", "F16C": "f16c", "SSSE3": "ssse3", "AVX_VNNI": "avx_vnni",
    "AVX512": "avx512f", "AVX512_VBMI": "avx512vbmi", "AVX512_VNNI": "avx512_vnni", "AVX512_BF16": "avx512_bf16",
    "AMX_INT8": "amx_int8",
}  # fmt: skip
_VERSION = re.compile(r"\d+(\.\d+)+([.+-][0-9A-Za-z.]+)?")


def contradictions(fp: dict[str, Any]) -> list[str]:
    """What a fingerprint says of llama.cpp that the rest of it contradicts: a version that is not one, or
    kernels its own CPU's flags could not run (a build for features the CPU lacks dies at its first use)."""
    build = fp.get("llama_cpp")
    if not build:
        return []
    out = []
    if not _VERSION.fullmatch(str(build.get("version"))):
        out.append(f"llama.cpp version {ascii(build.get('version'))} is not a version")
    info = str(build.get("system_info", ""))
    if not info.isascii() or not info.isprintable():
        out.append("llama.cpp system_info holds characters no build prints")
    simd = set(fp.get("simd") or [])
    if simd:  # (empty where /proc/cpuinfo could not be read: nothing to hold it to)
        on = re.findall(r"([A-Z][A-Z0-9_]*) = 1\b", info)
        out += [
            f"llama.cpp reports {w} on a CPU without {_RUNS_ON[w]}"
            for w in on
            if _RUNS_ON.get(w, w) not in simd and w in _RUNS_ON
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
    return dataclasses.replace(fp, digest=digest(serial.to_json(fp)))


def digest(fp: dict[str, Any]) -> str:
    """sha256 over every field but the digest itself: equal digests, same kernels."""
    body = {k: v for k, v in fp.items() if k != "digest"}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def describe(fp: dict[str, Any] | None) -> str:
    """One phrase a reader can place: the CPU, and the BLAS kernel where there is one."""
    if not fp:
        return "an unrecorded machine"
    kernel = (fp.get("blas") or {}).get("kernel")
    return str(fp.get("cpu")) + (f" (BLAS kernel {kernel})" if kernel else "")
