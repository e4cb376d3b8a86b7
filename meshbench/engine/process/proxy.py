"""The engine in its own process, seen from the node: the child (``engine_child``) that loads the model
and runs one engine at a time, owned and stopped here, and the proxy that keeps the BatchEngine
contract.

One round trip per engine call over a socket pair (a tick is one call, ``step``): the parent sends
plain tuples (ids, positions, token ids) and the child answers with tokens and margins; logits
never leave the child (sampling is done there). Every answer carries the engine's KV bytes in
use, so reading that figure costs no round trip. When the child dies (any signal or exit), the
proxy raises ``EngineLost`` with the cause, and from then on has no KV: the memory went with the
process.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from multiprocessing.connection import Connection
from typing import Sequence

from meshbench.engine.base import (
    DecodeItem,
    EngineFault,
    EngineLimits,
    EngineLost,
    InjectedFault,
    PrefillChunk,
    StepResult,
    TickResult,
)
from meshbench.engine.process.children import die_with_parent
from meshbench.engine.rpc import Endpoint
from meshbench.engine.setup import EngineSizing
from meshbench.engine.spec import EngineSpec
from meshbench.errors import EngineUnavailable, MeshbenchError
from meshbench.records import serial

START_TIMEOUT_S = 300.0  # loading a model onto RPC workers sends every weight over the network
CALL_TIMEOUT_S = 300.0  # one engine call; beyond it the child is killed and counted as lost
_RAISED = {
    "MeshbenchError": MeshbenchError,
    "EngineUnavailable": EngineUnavailable,
    "EngineFault": EngineFault,
    "InjectedFault": InjectedFault,
}


def exit_cause(code: int | None) -> str:
    """``SIGKILL`` for a child killed by signal 9, ``exit 1`` for one that exited with 1."""
    if code is None:
        return "no exit status"
    if code < 0:
        try:
            return signal.Signals(-code).name
        except ValueError:
            return f"signal {-code}"
    return f"exit {code}"


# --- the parent ----------------------------------------------------------------------------
def child_environment(tiled_mm: str = "auto") -> dict:
    """Ours, plus: GGML_NO_BACKTRACE (ggml would run gdb as it aborts, printing to stdout), and a longer
    spin for libgomp's worker threads unless the user chose one: between two llama_decode calls
    the child waits a round trip and the scheduler's bookkeeping (~0.1-0.3 ms), and libgomp's
    default spin (300000 rounds) then often puts the workers to sleep, so each tick paid their
    wake-up (measured: isolated decode tokens/s 0.91 of in-process at concurrency 1 with the
    default, 0.97 with 3000000; README, "What isolation costs")."""
    env = dict(os.environ, GGML_NO_BACKTRACE="1")
    env.setdefault("GOMP_SPINCOUNT", "3000000")
    # ggml's tiled K-quant matmul switch (engine.tiled_mm), read once per process: exactly the recipe's.
    env.pop("GGML_CPU_TILED_MM", None)
    env.pop("GGML_CPU_TILED_MM_FORCE", None)
    if tiled_mm == "off":
        env["GGML_CPU_TILED_MM"] = "0"
    elif tiled_mm == "force":
        env["GGML_CPU_TILED_MM_FORCE"] = "1"
    return env


class EngineProcess:
    """One child process running the engine kind ``spec`` names; stopped by the code that started it."""

    def __init__(
        self, spec: EngineSpec, sizing: EngineSizing, verbose: bool = False, endpoints: Sequence[Endpoint] = ()
    ) -> None:
        ours, theirs = socket.socketpair()
        # A fresh interpreter (no llama.cpp threads forked, no main module re-imported), given its end
        # of the socket pair by descriptor; the settings are its first message.
        # Its output never reaches ours: llama.cpp's abort message goes to a file we read on a loss.
        self._stderr = None if verbose else tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "meshbench.engine.process.child", str(theirs.fileno())],
            pass_fds=(theirs.fileno(),),
            stdin=subprocess.DEVNULL,
            stdout=None if verbose else subprocess.DEVNULL,
            stderr=self._stderr,
            env=child_environment(spec.tiled_mm),
            preexec_fn=die_with_parent(),
        )
        theirs.close()
        self._conn = Connection(ours.detach())
        self.lost: str | None = None
        self.kv_bytes = 0
        self.round_trip_ns = self.engine_ns = self.calls = 0
        # A blocking recv is the cheapest wait (a poll before it costs ~30 us a call here); a watchdog
        # thread bounds it instead: past the deadline of the call in flight, it kills the child.
        self._deadline: float | None = None
        self._timed_out: float | None = None
        self._stopped = threading.Event()
        threading.Thread(target=self._watch, name="meshbench-engine-watchdog", daemon=True).start()
        try:
            self._conn.send((spec, sizing, verbose, list(endpoints)))
            hello = self._receive(START_TIMEOUT_S)
        except EngineLost as e:  # it died loading the model: the user's problem to see, in one line
            words = self.last_words().splitlines()
            self.stop()
            raise MeshbenchError(
                f"the engine process died while loading the model ({e})" + (f": {words[-1][:300]}" if words else "")
            ) from None
        except BaseException:
            self.stop()
            raise
        self.info = serial.engine_info(hello["info"], "the engine process's record")
        self.vocab_size, self.context_length = hello["vocab_size"], hello["context_length"]
        self.eog = frozenset(hello["eog"])

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def alive(self) -> bool:
        return self.lost is None and self.proc.poll() is None

    def call(self, msg: tuple):
        """One round trip; the value, or the child's exception raised here, or EngineLost."""
        if self.lost is not None:
            raise EngineLost(f"{self.lost} (not restarted)")
        t0 = time.perf_counter_ns()
        try:
            self._conn.send(msg)
        except OSError:  # a broken pipe or reset: the child is gone
            self._lose()
        try:
            return self._receive(CALL_TIMEOUT_S)
        finally:  # an answer that is the engine's exception is a round trip too
            self.round_trip_ns += time.perf_counter_ns() - t0
            self.calls += 1

    def _receive(self, timeout_s: float):
        self._deadline, self._timeout_s = time.monotonic() + timeout_s, timeout_s
        try:
            status, value, self.kv_bytes, engine_ns = self._conn.recv()
        except (EOFError, OSError):
            self._lose()
        finally:
            self._deadline = None
        self.engine_ns += engine_ns
        if status == "err":
            name, text = value
            raise _RAISED.get(name, RuntimeError)(text if name in _RAISED else f"{name}: {text}")
        return value

    def _watch(self) -> None:
        while not self._stopped.wait(0.2):
            deadline = self._deadline
            if deadline is not None and time.monotonic() > deadline and self.proc.poll() is None:
                self._timed_out = deadline
                os.kill(self.proc.pid, signal.SIGKILL)

    def _lose(self):
        try:
            self.proc.wait(timeout=10.0)
        except subprocess.TimeoutExpired:  # the pipe broke but the process lingers: make the loss real
            self.kill()
        self.lost = f"engine lost: {exit_cause(self.proc.returncode)}"
        if self._timed_out is not None:
            self.lost = f"engine lost: no answer within {self._timeout_s:g} s (killed)"
        self.kv_bytes = 0
        raise EngineLost(self.lost)

    def last_words(self, limit: int = 4096) -> str:
        """The end of what the child wrote on stderr (llama.cpp's abort message): for diagnostics only,
        never in the records (it holds ports and addresses)."""
        if self._stderr is None:
            return ""
        self._stderr.seek(0, os.SEEK_END)
        self._stderr.seek(max(0, self._stderr.tell() - limit))
        return self._stderr.read().decode(errors="replace").strip()

    def kill(self) -> None:
        """SIGKILL the child (the fault plan's kill-engine, or a child that stopped answering)."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)  # by the id we started, never by name
        self.proc.wait()

    def stop(self) -> None:
        """Ask the child to exit, wait a bounded time, then kill it."""
        if self.proc.poll() is None and self.lost is None:
            try:
                self._conn.send(("exit",))
                self.proc.wait(timeout=10.0)
            except (OSError, subprocess.TimeoutExpired):
                pass
        self.kill()
        self._stopped.set()
        self._conn.close()
        if self._stderr is not None:
            self._stderr.close()


class ProxyEngine:
    """The BatchEngine contract over an EngineProcess: one round trip per call."""

    def __init__(self, process: EngineProcess, limits: EngineLimits) -> None:
        self.process = process
        self._figures = process.call(("make", limits))
        self._armed: dict[str, str] = {}  # "prefill"/"decode" -> "raise"/"abort", for the next such call

    def arm(self, call: str, fault: str) -> None:
        """Make the next ``call`` ("prefill" or "decode") raise inside the child, or abort the child."""
        self._armed[call] = fault

    @property
    def recipe_fingerprint(self) -> str:
        return self._figures["recipe_fingerprint"]

    @property
    def vocab_size(self) -> int:
        return self._figures["vocab_size"]

    @property
    def kv_bytes_per_token(self) -> int:
        return self._figures["kv_bytes_per_token"]

    @property
    def weight_bytes(self) -> int:
        return self._figures["weight_bytes"]

    @property
    def scratch_bytes_per_session(self) -> int:
        return self._figures["scratch_bytes_per_session"]

    @property
    def kv_bytes_in_use(self) -> int:
        return 0 if self.process.lost else self.process.kv_bytes

    @property
    def kv_bytes_shared(self) -> int | None:
        return None  # engine.prefix_cache is refused with an engine in its own process (meshbench.engine.spec_rules)

    def step(self, decode: Sequence[DecodeItem], prefill: Sequence[PrefillChunk]) -> TickResult:
        """The tick's one round trip: the decode items and the prompt chunks together."""
        faults, self._armed = self._armed, {}
        d, p, decode_ns, prefill_ns = self.process.call(
            (
                "step",
                [(it.session_id, it.epoch, it.position, it.token) for it in decode],
                [
                    ((c.session.session_id, c.session.epoch, c.session.capacity), c.tokens, c.start, c.last)
                    for c in prefill
                ],
                faults,
            )
        )
        return TickResult(
            [StepResult(it.session_id, *r) for it, r in zip(decode, d)],
            [StepResult(c.session.session_id, *r) for c, r in zip(prefill, p)],
            decode_ns,
            prefill_ns,
        )

    def release(self, session_id: str) -> None:
        if not self.process.lost:  # a lost engine's KV went with its process
            self.process.call(("release", session_id))

    def close(self) -> None:
        if self.process.alive:
            self.process.call(("close",))
