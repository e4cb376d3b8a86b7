"""The endpoint client's own cost: how many streamed tokens one meshbench process receives per second, and how
much CPU each costs it, from a server that answers at once (the reference clock's server with every wait zero:
each token written and flushed as soon as the last one was).

Per pass, C closed-loop clients (the endpoint sweep's own client and threads) share ``requests`` requests of
``tokens`` tokens. Measured per pass:

- tokens received per second of wall time (first request to last token);
- the client's CPU per token: this process's CPU time over the pass (every client thread; the server is another
  process) over the tokens received;
- the server's CPU per token, from the CPU time its process reports (every thread's, to the nanosecond), where
  the two share the machine's cores: a ceiling the server sets is not the client's;
- each token's delay from the server's send stamp (after its flush) to the client's stamp. With a server this
  fast it is the client's backlog (tokens written, not yet read), not its clock's error: ``bench clock`` measures
  that error with a server that paces its tokens as a model does.

One core's worth of the client, 1e6 / (CPU µs per token), is the client's ceiling: the most tokens/s one meshbench
process could stamp on one core, whatever the server, if CPU were all it waited for. Where the tokens/s received
fall far below it, the client waits on something else: with a thread per client, on the interpreter's lock handed
between its threads. Each pass is therefore run twice, interleaved: by meshbench's client (``threads``) and by a
reference client that reads the same streams as asyncio tasks on one thread (meshbench.bench.async_client).
Figures are medians of the passes, with min and max.
"""

from __future__ import annotations

import http.client
import json
import time
from dataclasses import dataclass
from typing import Callable, Sequence

from meshbench.analysis import latency
from meshbench.bench import async_client
from meshbench.bench.reference_clock import Tail, log, serving
from meshbench.endpoint.client import Endpoint
from meshbench.endpoint.load import Job, closed_loop
from meshbench.errors import MeshbenchError
from meshbench.records.endpoint_figures import Spread

MAX_PASS_TOKENS = 1 << 21  # every token's two stamps are held until the pass ends


CLIENTS = ("threads", "asyncio")  # meshbench's client (a thread per client), and the reference beside it


@dataclass(frozen=True, slots=True)
class _Pass:
    tokens_per_s: float
    client_cpu_us_per_token: float
    server_cpu_us_per_token: float
    delay_ms: list[float]


@dataclass(frozen=True, slots=True)
class ClientFigures:
    """One client's figures at one level: each a median (min, max) over the rounds; the delays pooled."""

    client: str  # CLIENTS
    tokens_per_s: Spread
    client_cpu_us_per_token: Spread
    server_cpu_us_per_token: Spread
    client_ceiling_tokens_per_s: float | None  # 1e6 / the median client CPU per token (None: no CPU measured)
    delay_ms: Tail  # a token: the server's send stamp to the client's


@dataclass(frozen=True, slots=True)
class CeilingLevel:
    concurrency: int
    clients: list[ClientFigures]  # in CLIENTS' order


@dataclass(frozen=True, slots=True)
class CeilingResult:
    """``meshbench bench client``'s figures (``--json``: this record's fields, as they are named here)."""

    requests: int
    tokens: int
    rounds: int
    levels: list[CeilingLevel]


def run(levels: Sequence[int], requests: int, tokens: int, rounds: int,
        progress: Callable[[str], None] = lambda m: None) -> CeilingResult:  # fmt: skip
    """Per level of C clients and per client, each figure's median (min, max) over ``rounds`` passes, and the
    delays pooled; the two clients' passes interleaved, their order alternating round by round."""
    if requests * tokens > MAX_PASS_TOKENS:
        raise MeshbenchError(
            f"client ceiling: {requests * tokens} tokens in a pass (requests x tokens) is over the "
            f"{MAX_PASS_TOKENS} a pass may stamp"
        )
    done: list[CeilingLevel] = []
    with serving() as (endpoint, _):
        for c in levels:
            passes: dict[str, list[_Pass]] = {name: [] for name in CLIENTS}
            for r in range(rounds):
                for name in CLIENTS if r % 2 == 0 else CLIENTS[::-1]:
                    progress(f"client ceiling: {c} clients, {name}, round {r + 1} of {rounds}")
                    passes[name].append(_pass(endpoint, name, c, requests, tokens, f"ceiling-{name}-{c}-{r}"))
            done.append(CeilingLevel(concurrency=c, clients=[_summary(name, passes[name]) for name in CLIENTS]))
    return CeilingResult(requests=requests, tokens=tokens, rounds=rounds, levels=done)


def _pass(endpoint: Endpoint, client: str, c: int, requests: int, tokens: int, tag: str) -> _Pass:
    ids = [f"{tag}-{k}" for k in range(requests)]
    reference = {"first_ms": 0.0, "gaps_ms": [0.0] * (tokens - 1)}
    body = endpoint.body([1, 2, 3], "", tokens, False, 0)
    bodies = [{**body, "reference": {**reference, "id": i}} for i in ids]
    server_cpu, cpu = _cpu_s(endpoint), time.process_time()
    t0 = time.monotonic_ns()
    if client == "threads":
        done, _ = closed_loop(endpoint, [Job(f"s{k:03d}", b) for k, b in enumerate(bodies)], c, t0)
        failed = [x for x in done if x.error]
        if failed:
            raise MeshbenchError(f"client ceiling: {failed[0].session_id} failed: {failed[0].error}")
        stamps = [x.token_ns for x in done]
    else:
        stamps = async_client.closed_loop(endpoint.target.host, endpoint.target.port, bodies, c, t0)
    cpu = time.process_time() - cpu
    server_after = _cpu_s(endpoint)
    received = sum(len(x) for x in stamps)
    if received != len(bodies) * tokens:
        raise MeshbenchError(f"client ceiling: {received} tokens received of the {len(bodies) * tokens} sent")
    wall_s = max(x[-1] for x in stamps) / 1e9
    sent = log(endpoint, tag, ids)
    delays = [(a - (s - t0)) / latency.MS for x, i in zip(stamps, ids) for a, s in zip(x, sent[i]["sent_ns"])]
    server = (server_after - server_cpu) / received * 1e6
    return _Pass(
        tokens_per_s=received / wall_s,
        client_cpu_us_per_token=cpu / received * 1e6,
        server_cpu_us_per_token=server,
        delay_ms=delays,
    )


def _spread(values: Sequence[float]) -> Spread:
    return Spread.of(values)


def _summary(client: str, passes: list[_Pass]) -> ClientFigures:
    cpu = _spread([p.client_cpu_us_per_token for p in passes])
    return ClientFigures(
        client=client,
        tokens_per_s=_spread([p.tokens_per_s for p in passes]),
        client_cpu_us_per_token=cpu,
        server_cpu_us_per_token=_spread([p.server_cpu_us_per_token for p in passes]),
        client_ceiling_tokens_per_s=1e6 / cpu.median if cpu.median > 0 else None,
        delay_ms=Tail.of([d for p in passes for d in p.delay_ms]),
    )


def _cpu_s(endpoint: Endpoint) -> float:
    """The server process's CPU time (s), as it reports it."""
    conn = http.client.HTTPConnection(endpoint.target.host, endpoint.target.port, timeout=10)
    try:
        conn.request("GET", "/cpu")
        return float(json.loads(conn.getresponse().read())["cpu_s"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise MeshbenchError(f"client ceiling: the server did not report its CPU time ({e})") from None
    finally:
        conn.close()
