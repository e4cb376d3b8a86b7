"""The machine as the kernels see it: the CPU's model, the flags that select kernels, and llama.cpp's build
with the features it reports. A floor every layer may read (the compute fingerprint, meshbench.results.fingerprint,
and the engine's recipe probe, meshbench.engine.recipe, both key on it)."""

from __future__ import annotations

import os
import platform
import re
from pathlib import Path


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity: taskset, a cgroup's cpuset), not every CPU the machine has:
    the default thread count, so that llama.cpp's spinning threads never outnumber the cores they are given."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):  # (not on Linux)
        return os.cpu_count() or 1


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


# The x86 and Arm flags that ggml and OpenBLAS dispatch on (others do not change arithmetic).
KERNEL_FLAGS = frozenset(
    {
        "sse3", "ssse3", "sse4_1", "sse4_2", "avx", "avx2", "fma", "f16c", "avx_vnni",
        "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512cd", "avx512_vnni", "avx512_bf16",
        "avx512vbmi", "avx512_fp16", "amx_tile", "amx_int8", "amx_bf16",
        "asimd", "asimddp", "sve", "sve2", "i8mm", "bf16", "fphp", "asimdhp",
    }
)  # fmt: skip


def simd_flags(cpuinfo: str | None = None) -> list[str]:
    """The kernel-selecting flags of the first CPU in /proc/cpuinfo, sorted (empty where it is unreadable)."""
    return sorted(KERNEL_FLAGS.intersection(_flags(cpuinfo) or ()))


def _flags(cpuinfo: str | None) -> list[str] | None:
    """The first CPU's flags line of /proc/cpuinfo (``cpuinfo``: its text), None where there is none to read."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return None
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return value.split()
    return None


def os_kernel(release: str | None = None) -> str:
    """The operating system and its kernel's major.minor release (Linux grants AMX's tile state per process from
    5.16; a patch release does not change what it grants)."""
    major_minor = ".".join(re.split(r"[.-]", platform.release() if release is None else release)[:2])
    return f"{platform.system()} {major_minor}"


def under_hypervisor(cpuinfo: str | None = None) -> bool | None:
    """Whether /proc/cpuinfo says the CPU is virtual (its "hypervisor" flag); None where it is unreadable."""
    flags = _flags(cpuinfo)
    return None if flags is None else "hypervisor" in flags


def llama_cpp_build() -> dict | None:
    """llama.cpp's version and the backend features it reports (``llama_print_system_info``), if installed."""
    try:
        import llama_cpp  # noqa: PLC0415 - optional dependency

        info = llama_cpp.llama_print_system_info()
        return {
            "version": str(llama_cpp.__version__),
            "system_info": (info.decode("utf-8", "replace") if isinstance(info, bytes) else str(info)).strip(),
        }
    except Exception:  # not installed, or its native library failed to load
        return None
