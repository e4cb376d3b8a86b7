"""The machine and code a result was measured on."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

import numpy as np

from meshbench.machine import cpu_model
from meshbench.records.context import Environment
from meshbench.results import fingerprint


def git_state(cwd: Path | None = None) -> tuple[str | None, bool | None]:
    """(commit, dirty) of the meshbench checkout; (None, None) where meshbench is not one (an installed wheel,
    even in a folder another repository holds), and dirty None where git could not say."""
    where = (cwd or Path(__file__).resolve().parent.parent).resolve()
    try:
        if Path(_git(where, "rev-parse", "--show-toplevel")).resolve() != where:
            return None, None
        commit = _git(where, "rev-parse", "HEAD")
    except (OSError, subprocess.SubprocessError):
        return None, None
    try:
        # Dirty means the code differs from the commit: a tracked file changed outside the evidence bundles
        # (rewriting them does not count), or a file under meshbench/ the commit lacks (a new module imports as
        # well as a changed one; a config is recorded in the bundle, a scratch file beside the checkout is none).
        changed = _git(where, "status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)evidence")
        added = _git(where, "status", "--porcelain", "--untracked-files=all", "--", "meshbench")
    except (OSError, subprocess.SubprocessError):
        return commit, None
    return commit, bool(changed or added)


def _git(where: Path, *args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=where, capture_output=True, text=True, timeout=10, check=True
    ).stdout.strip()


def llama_cpp_version() -> str | None:
    try:
        import llama_cpp  # noqa: PLC0415 - optional dependency

        return str(llama_cpp.__version__)
    except Exception:  # not installed, or its native library failed to load
        return None


def environment() -> Environment:
    commit, dirty = git_state()
    return Environment(
        python=platform.python_version(),
        numpy=np.__version__,
        llama_cpp=llama_cpp_version(),
        platform=platform.platform(),
        machine=platform.machine(),
        cpu=cpu_model(),
        cpu_count=os.cpu_count(),
        git_commit=commit,
        git_dirty=dirty,
        argv0=Path(sys.argv[0]).name if sys.argv else None,
        compute=fingerprint.fingerprint(),
    )
