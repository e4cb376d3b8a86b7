"""The machine and code a result was measured on."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

import numpy as np

from meshbench.results import fingerprint
from meshbench.results.fingerprint import cpu_model


def git_state(cwd: Path | None = None) -> tuple[str | None, bool | None]:
    """(commit, dirty) of the meshbench checkout, or (None, None) outside a git work tree."""
    where = cwd or Path(__file__).resolve().parent.parent
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=where, capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
        # Dirty means the code differs from the commit: a tracked file changed outside the evidence bundles
        # (rewriting them does not count), or a file the commit lacks in the code, its configs or schemas (a
        # new module imports as well as a changed one; a scratch file beside the checkout does not count).
        changed = _status(where, "--untracked-files=no", ".", ":(exclude)evidence")
        added = _status(where, "--untracked-files=all", *UNTRACKED_COUNTS)
        return commit, bool(changed or added)
    except (OSError, subprocess.SubprocessError):
        return None, None


UNTRACKED_COUNTS = ("meshbench", "configs", "schemas", "pyproject.toml")


def _status(where: Path, untracked: str, *paths: str) -> str:
    return subprocess.run(
        ["git", "status", "--porcelain", untracked, "--", *paths],
        cwd=where,
        capture_output=True,
        text=True,
        timeout=10,
        check=True,
    ).stdout.strip()


def llama_cpp_version() -> str | None:
    try:
        import llama_cpp  # noqa: PLC0415 - optional dependency

        return str(llama_cpp.__version__)
    except Exception:  # not installed, or its native library failed to load
        return None


def environment() -> dict:
    commit, dirty = git_state()
    return {
        "python": platform.python_version(),
        "numpy": np.__version__,
        "llama_cpp": llama_cpp_version(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "git_commit": commit,
        "git_dirty": dirty,
        "argv0": Path(sys.argv[0]).name if sys.argv else None,
        "compute": fingerprint.fingerprint(),
    }
