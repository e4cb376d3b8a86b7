"""Local llama.cpp RPC workers that meshbench starts for a run, and always stops.

Each worker is ``meshbench node serve`` in its own process, on a free loopback port. The
owner waits until every worker accepts a connection (bounded), hands out their endpoints,
and in ``finally`` stops them by the process ids it started: SIGTERM, a bounded wait, SIGKILL.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from typing import Iterator

from meshbench.engine.process.children import die_with_parent
from meshbench.engine.rpc import Endpoint
from meshbench.errors import MeshbenchError

READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 10.0


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class Pool:
    """``count`` workers on 127.0.0.1, started together; ``respawn`` replaces them all on fresh ports."""

    def __init__(self, count: int, threads: int | None = None) -> None:
        self.count, self.threads = count, threads
        self._procs: list[tuple[subprocess.Popen, Endpoint]] = []

    @property
    def endpoints(self) -> list[Endpoint]:
        return [ep for _, ep in self._procs]

    def start(self) -> None:
        for _ in range(self.count):
            ep = Endpoint("127.0.0.1", free_port())
            cmd = [sys.executable, "-m", "meshbench.cli", "node", "serve", "--host", ep.host, "--port", str(ep.port)]
            if self.threads:
                cmd += ["--threads", str(self.threads)]
            self._procs.append(
                (
                    subprocess.Popen(
                        cmd,
                        stdin=subprocess.DEVNULL,
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.PIPE,
                        start_new_session=True,
                        preexec_fn=die_with_parent(),
                    ),
                    ep,
                )
            )
        for proc, ep in self._procs:
            _wait_ready(proc, ep)

    @property
    def alive(self) -> bool:
        return all(proc.poll() is None for proc, _ in self._procs)

    def kill(self, index: int) -> None:
        """SIGKILL worker ``index`` (a fault plan's kill-worker) and reap it."""
        proc = self._procs[index][0]
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait()

    def respawn(self) -> None:
        self.stop()
        self.start()

    def stop(self) -> None:
        procs, self._procs = self._procs, []
        for proc, _ in procs:
            stop(proc)


@contextmanager
def spawned(count: int, threads: int | None = None) -> Iterator[Pool]:
    """``count`` workers for the duration of the block (none: an empty pool), stopped in ``finally``."""
    pool = Pool(count, threads)
    try:
        pool.start()
        yield pool
    finally:
        pool.stop()


def _wait_ready(proc: subprocess.Popen, ep: Endpoint) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            err = (proc.stderr.read() if proc.stderr else b"").decode(errors="replace").strip().splitlines()
            raise MeshbenchError(
                f"rpc worker {ep} exited with {proc.returncode} before it was ready" + (f": {err[-1]}" if err else "")
            )
        try:
            with socket.create_connection((ep.host, ep.port), timeout=1.0):
                return
        except OSError:
            time.sleep(0.05)
    raise MeshbenchError(f"rpc worker {ep} did not listen within {READY_TIMEOUT_S:.0f} s")


def stop(proc: subprocess.Popen) -> None:
    """Stop a worker this process started, by its id: SIGTERM, a bounded wait, then SIGKILL."""
    if proc.poll() is None:
        try:
            os.kill(proc.pid, signal.SIGTERM)
            proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        except ProcessLookupError:
            pass
    if proc.stderr is not None:
        proc.stderr.close()
