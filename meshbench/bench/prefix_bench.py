"""What a prefix cache buys on the GGUF node, beside llama-server's prompt cache on the same workload.

Sides, each at every level C:
- the node with its prefix cache off and on, with ``kv_unified`` off (each sequence a stream of its own: a hit
  copies cells) and on (one stream: a hit shares cells);
- llama-server at ``aligned`` settings (server_bench.server_args: ``-np C`` and what identical tokens need), its
  prompt cache on as its users have it (``cache_prompt`` is not sent), and with ``cache_prompt: false``
  (optional: ``server``).

Per side and level: prompt positions computed (the node's sessions' prompt less their cached positions; the
server's ``timings.prompt_n``), TTFT p50 and p99 from the moment a slot took the session, total tokens/s
(prompt and generated over the pass's wall time), and whether every session's tokens equal the node's with
the cache off (kv_unified off). End-of-generation tokens are banned on every side (the server's ignore_eos), so
every side generates exactly the new tokens asked for. Repetitions rotate the level order and the sides' order.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from meshbench.analysis import stats
from meshbench.bench import server_bench
from meshbench.endpoint import llama_server
from meshbench.engine.setup import EngineSetup, close_engine
from meshbench.records.model import Summary
from meshbench.scheduler.budget import engine_limits
from meshbench.scheduler.session import GenerationRequest
from meshbench.sweep.passes import run_pass
from meshbench.sweep.plan import level_budget, level_orders
from meshbench.sweep.run import prepare
from meshbench.workload.config import RunConfig

NODE_SIDES = {  # side -> (kv_unified, prefix cache)
    "node, cache off, kv_unified off": (False, False),
    "node, cache on, kv_unified off (copies)": (False, True),
    "node, cache off, kv_unified on": (True, False),
    "node, cache on, kv_unified on (shared)": (True, True),
}
SERVER_SIDES = {  # side -> cache_prompt sent (None: nothing, the server's own default)
    "llama-server, its prompt cache (default)": None,
    "llama-server, cache_prompt false": False,
}
BOTH = (False, True)  # kv_unified off, on
REFERENCE = "node, cache off, kv_unified off"


@dataclass(frozen=True, slots=True, kw_only=True)
class Side:
    """One side at one level over the repetitions (None: a figure no repetition had: a server that does not say
    what it computed)."""

    tokens_identical: bool  # every repetition's tokens are the reference side's (REFERENCE)
    computed: Summary | None  # prompt positions computed
    ttft_ms_p50: Summary | None
    ttft_ms_p99: Summary | None
    tokens_per_s: Summary


@dataclass(frozen=True, slots=True, kw_only=True)
class PrefixLevel:
    concurrency: int
    sides: dict[str, Side]  # by side (NODE_SIDES, SERVER_SIDES)


@dataclass(frozen=True, slots=True, kw_only=True)
class PrefixBench:
    """``meshbench bench prefix``'s figures (``--json``: this record's fields)."""

    config: str
    server: str | None
    server_version: str | None
    server_args: list[str] | None
    repeat: int
    block_tokens: int
    levels: list[PrefixLevel]


def run(
    cfg: RunConfig,
    server: Path | None,
    levels: list[int],
    repeat: int,
    progress: Callable[[str], None] = lambda m: None,
) -> PrefixBench:
    """Every side at every level, ``repeat`` times, interleaved; ``server`` None: the node's sides only."""
    cfg = dataclasses.replace(
        cfg, workload=dataclasses.replace(cfg.workload, eos="ban"), engine=dataclasses.replace(cfg.engine, ban_eog=True)
    )
    setups = {
        u: prepare(dataclasses.replace(cfg, engine=dataclasses.replace(cfg.engine, kv_unified=bool(u)))) for u in (0, 1)
    }
    sides = [*NODE_SIDES, *(SERVER_SIDES if server is not None else ())]
    sliding = server_bench.has_sliding_layers(setups[False].info)
    try:
        requests = cfg.workload.requests(setups[False].vocab_size)
        _node(cfg, setups[False], requests, levels[0], False)  # warm-up: the first pass of a process is slower
        runs: dict[int, dict[str, list[server_bench.Pass]]] = {c: {s: [] for s in sides} for c in levels}
        for r, order in enumerate(level_orders(len(levels), repeat)):
            for i in order:
                c = levels[i]
                for side in sides[r % len(sides) :] + sides[: r % len(sides)]:
                    progress(f"repetition {r + 1}/{repeat}: {side}, concurrency {c}")
                    if side in NODE_SIDES:
                        unified, cache = NODE_SIDES[side]
                        runs[c][side].append(_node(cfg, setups[unified], requests, c, cache))
                    else:
                        assert server is not None
                        runs[c][side].append(_server(cfg, server, requests, c, SERVER_SIDES[side], sliding))
    finally:
        for s in setups.values():
            s.close()
    return PrefixBench(
        config=cfg.source,
        server=None if server is None else str(server),
        server_version=None if server is None else llama_server.version(server),
        server_args=None if server is None else server_bench.server_args(cfg, "aligned", 1, 0, sliding),
        repeat=repeat,
        block_tokens=cfg.engine.block_tokens,
        levels=[_level(c, runs[c]) for c in levels],
    )


def _node(
    cfg: RunConfig, setup: EngineSetup, requests: Sequence[GenerationRequest], c: int, cache: bool
) -> server_bench.Pass:
    budget = level_budget(cfg.budget, c, len(requests))
    limits = dataclasses.replace(engine_limits(budget), prefix_block_tokens=cfg.engine.block_tokens if cache else 0)
    engine = setup.make(limits)
    try:
        p = run_pass(requests, [0] * len(requests), budget, engine, prefill=cfg.prefill)
    finally:
        close_engine(engine)
    server_bench.check_completed(p.sessions)
    slots = [t.submit_ns if t.admit_ns is None else t.admit_ns for t in p.timing]
    out = server_bench.figures({s.session_id: s.tokens for s in p.sessions}, p.timing, slots, p.wall_s, requests)
    return dataclasses.replace(out, computed=sum(s.prompt_tokens - (s.cached_tokens or 0) for s in p.sessions))


def _server(
    cfg: RunConfig,
    server: Path,
    requests: Sequence[GenerationRequest],
    c: int,
    cache_prompt: bool | None,
    sliding: bool,
) -> server_bench.Pass:
    out, done = server_bench.one_server(cfg, server, requests, c, "aligned", sliding, cache_prompt=cache_prompt)
    computed = [x.computed for x in done]
    return dataclasses.replace(out, computed=None if None in computed else sum(x for x in computed if x is not None))


def _level(c: int, runs: dict[str, list[server_bench.Pass]]) -> PrefixLevel:
    """Each side's figures (median, min, max over the repetitions) and whether its tokens are the reference's."""
    ref = runs[REFERENCE][0].tokens

    def over(values: list[float | None]) -> Summary | None:
        known = [x for x in values if x is not None]
        return stats.summary(known) if known else None

    sides = {}
    for side, got in runs.items():
        rate = over([x.tokens_per_s for x in got])
        assert rate is not None  # (every pass has a rate)
        sides[side] = Side(
            tokens_identical=all(x.tokens == ref for x in got),
            computed=over([x.computed for x in got]),
            ttft_ms_p50=over([x.ttft_ms.p50 for x in got]),
            ttft_ms_p99=over([x.ttft_ms.p99 for x in got]),
            tokens_per_s=rate,
        )
    return PrefixLevel(concurrency=c, sides=sides)
