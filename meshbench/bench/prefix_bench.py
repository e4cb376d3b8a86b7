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
from pathlib import Path
from typing import Callable, Sequence

from meshbench.analysis import stats
from meshbench.bench import server_bench
from meshbench.endpoint import llama_server
from meshbench.engine.setup import EngineSetup, close_engine
from meshbench.scheduler.budget import engine_limits
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
FIGURES = ("computed", "ttft_ms.p50", "ttft_ms.p99", "tokens_per_s")


def run(
    cfg: RunConfig,
    server: Path | None,
    levels: list[int],
    repeat: int,
    progress: Callable[[str], None] = lambda m: None,
) -> dict:
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
        runs: dict[int, dict[str, list[dict]]] = {c: {s: [] for s in sides} for c in levels}
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
    return {
        "config": cfg.source,
        "server": None if server is None else str(server),
        "server_version": None if server is None else llama_server.version(server),
        "server_args": None if server is None else server_bench.server_args(cfg, "aligned", 1, 0, sliding),
        "repeat": repeat,
        "block_tokens": cfg.engine.block_tokens,
        "levels": [_level(c, runs[c]) for c in levels],
    }


def _node(cfg: RunConfig, setup: EngineSetup, requests, c: int, cache: bool) -> dict:
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
    out["computed"] = sum(s.prompt_tokens - (s.cached_tokens or 0) for s in p.sessions)
    return out


def _server(cfg: RunConfig, server: Path, requests, c: int, cache_prompt: bool | None, sliding: bool) -> dict:
    out, done = server_bench.one_server(cfg, server, requests, c, "aligned", sliding, cache_prompt=cache_prompt)
    computed = [x.computed for x in done]
    out["computed"] = None if None in computed else sum(x for x in computed if x is not None)
    return out


def _level(c: int, runs: dict[str, list[dict]]) -> dict:
    """Each side's figures (median, min, max over the repetitions) and whether its tokens are the reference's."""
    ref = runs[REFERENCE][0]["tokens"]
    sides = {}
    for side, got in runs.items():
        row: dict = {"tokens_identical": all(x["tokens"] == ref for x in got)}
        for k in FIGURES:
            values: Sequence[float] = [x[k] for x in got if x[k] is not None]
            row[k] = stats.summary(values) if values else None
        sides[side] = row
    return {"concurrency": c, "sides": sides}
