"""A server meshbench starts: its process on a loopback port, ready once ``/health`` answers 200, and stopped by the
process id meshbench started, always (SIGTERM, then SIGKILL). Each launcher (meshbench.endpoint.launchers) gives
the command line; what happens to the process is the same for every server."""

from __future__ import annotations

import http.client
import os
import signal
import subprocess
import time
from contextlib import contextmanager
from typing import Iterator, Mapping, Sequence

from meshbench.engine.process.children import die_with_parent
from meshbench.errors import MeshbenchError

STOP_S = 10.0  # from SIGTERM to SIGKILL


class NotReady(MeshbenchError):
    """The server died, or never answered /health, before it was ready: its settings do not run here."""


@contextmanager
def serving(
    cmd: Sequence[str], port: int, name: str, ready_s: float, env: Mapping[str, str] | None = None
) -> Iterator[str]:
    """``cmd`` (a server listening on 127.0.0.1:``port``) running while the block runs: its URL. Its output is
    dropped; ``name`` is what its errors call it."""
    proc = subprocess.Popen(
        list(cmd),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        preexec_fn=die_with_parent(),
        env=None if env is None else dict(env),
    )
    try:
        _wait_healthy(proc, port, name, ready_s)
        yield f"http://127.0.0.1:{port}"
    finally:
        stop(proc)


def exited(code: int, name: str = "llama-server") -> str:
    """Why a server that died said nothing: its exit, and for SIGILL what it means."""
    if code == -signal.SIGILL:
        return (
            f"{name} was killed by SIGILL (an instruction this CPU cannot run: llama.cpp's CPU weight "
            "repacking picks kernels, e.g. AMX, that this machine reports but cannot execute) before it was ready; "
            "the server's --no-repack runs it without them"
        )
    if code < 0:
        try:
            signame = signal.Signals(-code).name
        except ValueError:
            signame = f"signal {-code}"
        return f"{name} was killed by {signame} before it was ready"
    return f"{name} exited with {code} before it was ready"


def _wait_healthy(proc: subprocess.Popen, port: int, name: str, ready_s: float) -> None:
    deadline = time.monotonic() + ready_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise NotReady(exited(proc.returncode, name))
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", "/health")
            if conn.getresponse().status == 200:
                return
        except OSError:
            pass
        finally:
            conn.close()
        time.sleep(0.1)
    raise NotReady(f"{name} did not become healthy within {ready_s:.0f} s")


def stop(proc: subprocess.Popen) -> None:
    """Stop the server by the process id we started (SIGTERM, then SIGKILL after STOP_S)."""
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=STOP_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
