"""meshbench's latencies held to a reference clock: a server whose token times are known
(meshbench.bench.clock_server), driven by the endpoint sweep's own client (closed-loop clients, the same
stamping), every figure computed twice by the same code (meshbench.analysis.latency): from the client's stamps
and from the server's send stamps. Their difference is what meshbench's clock adds to a latency.

Two definitions of an inter-token latency are reported, because load generators differ: every gap pooled
(meshbench's ITL, vLLM's) and one mean gap per request (guidellm's ITL; vLLM's TPOT). The schedule makes them
differ: most gaps are short, a few are long stalls, as a server's are when a prompt is prefilled beside a decode.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from meshbench.analysis import latency
from meshbench.endpoint import llama_server
from meshbench.endpoint.client import Endpoint
from meshbench.endpoint.load import Job, closed_loop
from meshbench.engine import apis
from meshbench.engine.process.children import die_with_parent
from meshbench.engine.process.workers import free_port
from meshbench.errors import MeshbenchError
from meshbench.workload.target import parse_target

READY_S = 20.0
GAPS_MS = (8.0, 12.0, 16.0)  # a token's usual gap
STALL_MS, STALL_SHARE = 60.0, 0.05  # and now and then a stall
FIGURES = ("ttft p50", "ttft p99", "itl p50 (every gap)", "itl p99 (every gap)", "itl p50 (mean per request)",
           "itl p99 (mean per request)", "e2e p50")  # fmt: skip


@dataclass(frozen=True, slots=True)
class _Stamps:
    submit_ns: int
    token_ns: list[int]


@dataclass(frozen=True, slots=True)
class Tail:
    """A distribution's median, 99th percentile (numpy's linear interpolation) and largest value, in ms."""

    p50: float
    p99: float
    max: float

    @staticmethod
    def of(values: Sequence[float]) -> Tail:
        a = np.asarray(values, dtype=np.float64)
        return Tail(p50=float(np.percentile(a, 50)), p99=float(np.percentile(a, 99)), max=float(a.max()))


@dataclass(frozen=True, slots=True)
class Figure:
    """One latency figure (FIGURES names it), the median over the rounds from each side's stamps (ms)."""

    name: str
    server: float  # from the server's send stamps
    meshbench: float  # from meshbench's client's stamps


@dataclass(frozen=True, slots=True)
class ClockLevel:
    concurrency: int
    figures: list[Figure]  # in FIGURES' order
    delay_ms: Tail  # a token: its send to its stamp
    request_ms: Tail  # a request: its stamp to its receipt


@dataclass(frozen=True, slots=True)
class ClockResult:
    """``meshbench bench clock``'s figures (``--json``: this record's fields, as they are named here)."""

    sessions: int
    tokens: int
    seed: int
    rounds: int
    levels: list[ClockLevel]


@dataclass(frozen=True, slots=True)
class _Pass:
    server: tuple[float, ...]  # FIGURES, in order
    meshbench: tuple[float, ...]
    delay_ms: list[float]
    request_ms: list[float]


def schedule(sessions: int, tokens: int, seed: int) -> list[dict[str, Any]]:
    """Each session's wait before its first token and its gaps after it (ms), drawn from ``seed``."""
    rng = np.random.default_rng(seed)
    out = []
    for k in range(sessions):
        gaps = [STALL_MS if rng.random() < STALL_SHARE else float(rng.choice(GAPS_MS)) for _ in range(tokens - 1)]
        out.append({"first_ms": 30.0 + 10.0 * (k % 3), "gaps_ms": gaps})
    return out


def run(levels: Sequence[int], sessions: int, tokens: int, seed: int, rounds: int,
        progress: Callable[[str], None] = lambda m: None) -> ClockResult:  # fmt: skip
    """Per level, every figure from the server's stamps and from meshbench's, over ``rounds`` passes."""
    with serving() as (endpoint, _):
        plan = schedule(sessions, tokens, seed)
        done: list[ClockLevel] = []
        for c in levels:
            passes = []
            for r in range(rounds):
                progress(f"reference clock: {c} clients, round {r + 1} of {rounds}")
                passes.append(_pass(endpoint, plan, c, f"{c}-{r}"))
            done.append(_summary(c, passes))
        return ClockResult(sessions=sessions, tokens=tokens, seed=seed, rounds=rounds, levels=done)


@contextlib.contextmanager
def serving() -> Iterator[tuple[Endpoint, subprocess.Popen[bytes]]]:
    """The reference clock's server on a free loopback port, and meshbench's client for it; stopped on leaving,
    by the process id started here (SIGTERM, then SIGKILL after 10 s)."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "meshbench.bench.clock_server", str(port)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        preexec_fn=die_with_parent(),
    )
    try:
        _wait_ready(proc, port)
        yield Endpoint(parse_target(f"http://127.0.0.1:{port}"), apis.NATIVE.name, 60.0), proc
    finally:
        llama_server.stop(proc)


def _pass(endpoint: Endpoint, plan: list[dict[str, Any]], c: int, tag: str) -> _Pass:
    jobs = []
    for k, ref in enumerate(plan):
        body = endpoint.body([1, 2, 3], "", len(ref["gaps_ms"]) + 1, False, 0)
        jobs.append(Job(f"s{k:02d}", {**body, "reference": {**ref, "id": f"{tag}-{k}"}}))
    t0 = time.monotonic_ns()
    done, _ = closed_loop(endpoint, jobs, c, t0)
    failed = [x for x in done if x.error]
    if failed:
        raise MeshbenchError(f"reference clock: {failed[0].session_id} failed: {failed[0].error}")
    sent = log(endpoint, tag, [f"{tag}-{k}" for k in range(len(plan))])
    server = [_Stamps(x.submit_ns, [s - t0 for s in sent[f"{tag}-{k}"]["sent_ns"]]) for k, x in enumerate(done)]
    if any(len(x.token_ns) != len(s.token_ns) for x, s in zip(done, server)):
        raise MeshbenchError("reference clock: the client saw another number of tokens than the server sent")
    delays = [(a - b) / latency.MS for x, s in zip(done, server) for a, b in zip(x.token_ns, s.token_ns)]
    requests = [(sent[f"{tag}-{k}"]["received_ns"] - t0 - x.submit_ns) / latency.MS for k, x in enumerate(done)]
    return _Pass(server=_figures(server), meshbench=_figures(done), delay_ms=delays, request_ms=requests)


def _figures(stamps: Sequence[latency.Stamped]) -> tuple[float, ...]:
    """FIGURES, in order, from these stamps."""
    lat = latency.samples(stamps)
    ttft, itl, tpot, e2e = (np.asarray(x, dtype=np.float64) for x in (lat.ttft, lat.itl, lat.tpot, lat.e2e))
    pairs = ((ttft, 50), (ttft, 99), (itl, 50), (itl, 99), (tpot, 50), (tpot, 99), (e2e, 50))
    return tuple(float(np.percentile(a, q)) for a, q in pairs)


def _summary(c: int, passes: list[_Pass]) -> ClockLevel:
    """Each figure's median over the rounds, from either side's stamps, and the per-token delivery delay."""
    figures = [
        Figure(
            name=name,
            server=statistics.median(p.server[k] for p in passes),
            meshbench=statistics.median(p.meshbench[k] for p in passes),
        )
        for k, name in enumerate(FIGURES)
    ]
    return ClockLevel(
        concurrency=c,
        figures=figures,
        delay_ms=Tail.of([d for p in passes for d in p.delay_ms]),
        request_ms=Tail.of([d for p in passes for d in p.request_ms]),
    )


def log(endpoint: Endpoint, tag: str, ids: list[str]) -> dict[str, Any]:
    """The server's stamps of this pass's requests, once each has all of them (the last is taken just after the
    client may have read it)."""
    deadline = time.monotonic() + READY_S
    while True:
        conn = http.client.HTTPConnection(endpoint.target.host, endpoint.target.port, timeout=10)
        try:
            conn.request("GET", f"/clock/{tag}")
            stamps: dict[str, Any] = json.loads(conn.getresponse().read())
        finally:
            conn.close()
        if all(i in stamps and len(stamps[i]["sent_ns"]) == stamps[i]["tokens"] for i in ids):
            return stamps
        if time.monotonic() > deadline:
            raise MeshbenchError("the reference clock's server did not record every send")
        time.sleep(0.01)


def _wait_ready(proc: subprocess.Popen[bytes], port: int) -> None:
    deadline = time.monotonic() + READY_S
    while time.monotonic() < deadline:
        time.sleep(0.05)
        if proc.poll() is not None:
            raise MeshbenchError(f"the reference clock's server exited with {proc.returncode} before it was ready")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
            conn.request("GET", "/props")
            if conn.getresponse().status == 200:
                return
        except OSError:
            pass
    raise MeshbenchError(f"the reference clock's server did not answer within {READY_S:.0f} s")
