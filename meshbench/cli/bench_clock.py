"""``meshbench bench clock``: meshbench's latencies against a server whose token times are known."""

from __future__ import annotations

import dataclasses
from typing import Annotated

import typer

from meshbench.bench import client_ceiling, reference_clock
from meshbench.cli.bench import bench_app
from meshbench.cli.common import JsonOpt, err, int_list, out, print_json, table
from meshbench.cli.options import flag
from meshbench.records.endpoint_figures import Spread


@bench_app.command("clock")
def bench_clock(
    levels: Annotated[str, flag("--levels", help="Closed-loop clients per level, e.g. 1,4,16.")] = "1,4,16",
    sessions: Annotated[int, flag("--sessions", min=1, max=256, help="Requests per pass.")] = 16,
    tokens: Annotated[int, flag("--tokens", min=2, max=1024, help="Tokens per request.")] = 32,
    rounds: Annotated[int, flag("--rounds", min=1, max=100, help="Passes per level.")] = 3,
    seed: Annotated[int, flag("--seed", min=0, help="The schedule's seed.")] = 0,
    as_json: JsonOpt = False,
) -> None:
    """meshbench's TTFT, ITL and E2E against a reference clock: a loopback server that sends each token on a known
    schedule and stamps every send. Both ITL definitions: every gap pooled, and one mean per request."""
    chosen = int_list(levels, "--levels", unique=True, maximum=sessions)  # (more clients than requests: idle)
    res = reference_clock.run(chosen, sessions, tokens, seed, rounds, progress=lambda m: err.print(m, markup=False))
    if as_json:
        print_json(dataclasses.asdict(res))
        return
    t = table(
        f"a reference clock: {sessions} requests of {tokens} tokens per pass, medians of {rounds} passes (ms)",
        ("C", "figure", "server's send stamps", "meshbench's client", "difference"),
    )
    for lv in res.levels:
        c = str(lv.concurrency)
        for v in lv.figures:
            t.add_row(c, v.name, f"{v.server:.2f}", f"{v.meshbench:.2f}", f"{v.meshbench - v.server:+.2f}")
        for d, name in ((lv.delay_ms, "a token: sent to stamped"), (lv.request_ms, "a request: stamped to received")):
            t.add_row(c, f"{name}, p50 / p99 / max", "", f"{d.p50:.2f} / {d.p99:.2f} / {d.max:.2f}", "")
    out.print(t)


@bench_app.command("client")
def bench_client(
    levels: Annotated[str, flag("--levels", help="Closed-loop clients per level, e.g. 1,4,16.")] = "1,4,16,64",
    requests: Annotated[int, typer.Option("--requests", min=1, max=4096, help="Requests per pass.")] = 64,
    tokens: Annotated[int, flag("--tokens", min=2, max=4096, help="Tokens per request.")] = 512,
    rounds: Annotated[int, flag("--rounds", min=1, max=100, help="Passes per level.")] = 3,
    as_json: JsonOpt = False,
) -> None:
    """The endpoint client's own cost: streamed tokens/s one meshbench process receives from a loopback server
    that answers at once, its CPU per token (so its one-core ceiling), the server's, and how late the client
    stamps a token after the server sent it; beside it, interleaved, a reference client of asyncio tasks on one
    thread reading the same streams."""
    chosen = int_list(levels, "--levels", unique=True, maximum=requests)  # (more clients than requests: idle)
    res = client_ceiling.run(chosen, requests, tokens, rounds, progress=lambda m: err.print(m, markup=False))
    if as_json:
        print_json(dataclasses.asdict(res))
        return
    t = table(
        f"the client's own cost: {requests} requests of {tokens} tokens per pass, medians (min..max) of {rounds} "
        "passes; at this rate the send-to-stamp delay is the client's backlog",
        (
            "C",
            "client",
            "tokens/s received",
            "client CPU µs/token",
            "server CPU µs/token",
            "client ceiling tok/s (1 core)",
            "send to stamp ms p50 / p99 / max",
        ),  # fmt: skip
    )
    for lv in res.levels:
        for x in lv.clients:
            d, ceiling = x.delay_ms, x.client_ceiling_tokens_per_s
            t.add_row(str(lv.concurrency), x.client, _spread(x.tokens_per_s, ".0f"),
                      _spread(x.client_cpu_us_per_token), _spread(x.server_cpu_us_per_token),
                      "-" if ceiling is None else f"{ceiling:.0f}",
                      f"{d.p50:.2f} / {d.p99:.2f} / {d.max:.2f}")  # fmt: skip
    out.print(t)


def _spread(s: Spread, fmt: str = ".1f") -> str:
    return f"{s.median:{fmt}} ({s.min:{fmt}}..{s.max:{fmt}})"
