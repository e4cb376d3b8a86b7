"""The engine's own process: ``python -m meshbench.engine.process.child FD``. It reads its settings from
the socket it is given, sets the engine kind up once, then answers one command at a time (make an
engine, a tick's step, prefill, decode, release, close) until told to exit or its parent goes away.
Injected faults act here: a ``raise`` inside the call's part, an ``abort`` of the whole process."""

from __future__ import annotations

import os
import resource
import signal
import sys
import time
from multiprocessing.connection import Connection

from meshbench.engine import factory
from meshbench.engine.base import (
    DecodeItem,
    InjectedFault,
    PrefillChunk,
    SessionHandle,
    StepResult,
    step_with_faults,
)
from meshbench.engine.rpc import Endpoint
from meshbench.engine.setup import EngineSizing
from meshbench.engine.spec import EngineSpec
from meshbench.records import serial


def serve(conn, spec: EngineSpec, sizing: EngineSizing, verbose: bool, endpoints: list[Endpoint]) -> None:
    """The child's loop: set up the engine kind once, then answer one command at a time until told to
    exit or the parent goes away."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle; it stops us
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # an abort leaves no core file behind
    try:
        setup = factory.setup(spec, sizing, verbose=verbose, endpoints=endpoints)
    except Exception as e:  # a bad model or spec: the parent reports it as the user's error
        conn.send(("err", (type(e).__name__, str(e)), 0, 0))
        return
    conn.send(
        (
            "ok",
            {
                "info": serial.to_json(setup.info),  # (a pipe between processes: the record as JSON)
                "vocab_size": setup.vocab_size,
                "context_length": setup.context_length,
                "eog": sorted(setup.eog),
            },
            0,
            0,
        )
    )
    state = {"engine": None}
    try:
        while True:
            try:
                msg = conn.recv()
            except (EOFError, OSError):
                return  # the parent is gone
            if msg[0] == "exit":
                return
            conn.send(_answer(setup, state, msg))
    finally:
        _close(state)
        setup.close()


def _answer(setup, state: dict, msg: tuple) -> tuple:
    t0 = time.perf_counter_ns()
    try:
        value = _run(setup, state, msg)
    except Exception as e:
        engine = state["engine"]
        return ("err", (type(e).__name__, str(e)), engine.kv_bytes_in_use if engine else 0, time.perf_counter_ns() - t0)
    engine = state["engine"]
    return ("ok", value, engine.kv_bytes_in_use if engine else 0, time.perf_counter_ns() - t0)


def _run(setup, state: dict, msg: tuple):
    op = msg[0]
    if op == "make":
        _close(state)
        engine = state["engine"] = setup.make(msg[1])
        return {
            k: getattr(engine, k)
            for k in (
                "recipe_fingerprint",
                "vocab_size",
                "kv_bytes_per_token",
                "weight_bytes",
                "scratch_bytes_per_session",
            )
        }
    engine = state["engine"]
    if op == "close":
        return _close(state)
    if op == "release":
        return engine.release(msg[1])
    _fault(msg[-1], op)
    if op == "step":
        _, decode, chunks, faults = msg
        out = step_with_faults(
            engine,
            [DecodeItem(*it) for it in decode],
            [PrefillChunk(SessionHandle(*h), tuple(t), start, last) for h, t, start, last in chunks],
            faults.get("decode") == "raise",
            faults.get("prefill") == "raise",
        )
        return ([_result(r) for r in out.decode], [_result(r) for r in out.prefill], out.decode_ns, out.prefill_ns)
    raise ValueError(f"unknown engine command {op!r}")


def _result(r: StepResult) -> tuple:
    return r.token, r.margin, r.cache_miss, r.error, r.cause, r.cached, r.runner_up


def _fault(fault, op: str) -> None:
    """An injected fault, inside the engine call: an exception, or the process aborting."""
    if isinstance(fault, dict):  # a step: its parts' faults (a raise is the step's to place)
        fault = "abort" if "abort" in fault.values() else None
    if fault == "abort":
        os.abort()  # SIGABRT, as llama.cpp's GGML_ABORT does
    if fault == "raise":
        raise InjectedFault(f"injected into the {op} call")


def _close(state: dict) -> None:
    engine, state["engine"] = state["engine"], None
    if engine is not None:
        engine.close()


if __name__ == "__main__":  # the child: python -m meshbench.engine.process.child FD
    _conn = Connection(int(sys.argv[1]))
    serve(_conn, *_conn.recv())
