"""Processes meshbench starts die with it: a parent-death signal set in the child before it runs.

The code that starts a child stops it (``finally``, by its pid); this covers the one case that code
cannot: meshbench itself killed with SIGKILL. Linux's PR_SET_PDEATHSIG sends the child SIGKILL when the
thread that forked it ends; elsewhere nothing is set.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from typing import Callable

PR_SET_PDEATHSIG = 1


def die_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` for subprocess.Popen (None where the platform has no parent-death signal)."""
    if not sys.platform.startswith("linux"):
        return None
    parent = os.getpid()
    libc = ctypes.CDLL(None, use_errno=True)

    def preexec() -> None:
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the signal was set
            os._exit(1)

    return preexec
