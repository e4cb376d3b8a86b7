"""What sampling the server's gauges costs a pass (meshbench.endpoint.gauges): one llama-server, started as an
endpoint config says (``--serve llama-server``), the config's sessions on C closed-loop clients, in pairs of
passes with and without the sampler; which side of a pair goes first alternates by pair. Every request goes
over the native API with eos banned, so both sides of a pair generate the same tokens. Per pass: tokens/s
(generated, over the wall time) and ITL p99 (every gap pooled); per level: each side's median, the ratio
sampled / unsampled of each pair (median and range), and the samples a sampled pass took."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable

from meshbench.analysis import latency
from meshbench.analysis.server_accounting import SAMPLE_INTERVAL_S
from meshbench.endpoint import gauges
from meshbench.endpoint.client import Endpoint
from meshbench.endpoint.load import Job, closed_loop
from meshbench.endpoint.sweep import served
from meshbench.engine import apis, kinds, launchers
from meshbench.errors import MeshbenchError
from meshbench.records.endpoint_figures import Spread
from meshbench.workload import prompts as prompts_mod
from meshbench.workload.config import RunConfig
from meshbench.workload.target import parse_target


@dataclass(frozen=True, slots=True)
class _Pass:
    tokens_per_s: float
    itl_p99_ms: float | None
    samples: int


@dataclass(frozen=True, slots=True)
class Sides:
    """One figure at one level: each side's median over the pairs, and the ratio sampled / unsampled per pair."""

    sampled: float | None
    unsampled: float | None
    ratio: Spread | None

    @staticmethod
    def of(both: list[tuple[float, float]]) -> Sides:
        ratios = [a / b for a, b in both if b]
        return Sides(
            sampled=statistics.median(a for a, _ in both) if both else None,
            unsampled=statistics.median(b for _, b in both) if both else None,
            ratio=Spread.of(ratios) if ratios else None,
        )


@dataclass(frozen=True, slots=True)
class GaugeLevel:
    concurrency: int
    pairs: int
    tokens_per_s: Sides
    itl_p99_ms: Sides
    samples_per_pass: float


@dataclass(frozen=True, slots=True)
class GaugeCost:
    """``meshbench bench gauges``'s figures (``--json``: this record's fields)."""

    config: str
    server_version: str
    server_args: list[str]
    interval_s: float
    levels: list[GaugeLevel]


def _pass(endpoint: Endpoint, jobs: list[Job], c: int, sampled: bool) -> _Pass:
    with gauges.sampled(endpoint, t0 := time.monotonic_ns(), sampled) as samples:
        done, wall_s = closed_loop(endpoint, jobs, c, t0)
    bad = [x for x in done if x.error]
    if bad:
        raise MeshbenchError(f"llama-server: {bad[0].session_id}: {bad[0].error}")
    gaps = [g for x in done for g in latency.itl_ms(x.token_ns)]
    return _Pass(
        tokens_per_s=sum(len(x.tokens) for x in done) / wall_s,
        itl_p99_ms=latency.percentile(gaps, 99),
        samples=len(samples.within(wall_s) or []),
    )


def _level(c: int, pairs: list[tuple[_Pass, _Pass]]) -> GaugeLevel:
    itl = [(on.itl_p99_ms, off.itl_p99_ms) for on, off in pairs]
    return GaugeLevel(
        concurrency=c,
        pairs=len(pairs),
        tokens_per_s=Sides.of([(on.tokens_per_s, off.tokens_per_s) for on, off in pairs]),
        itl_p99_ms=Sides.of([(a, b) for a, b in itl if a is not None and b is not None]),
        samples_per_pass=statistics.median(on.samples for on, _ in pairs),
    )


def check(cfg: RunConfig) -> None:
    starts = cfg.engine.serve is not None and launchers.of(cfg.engine.serve).flavour.metrics is not None
    if kinds.of(cfg.engine.kind).own or not starts or cfg.workload.prompts is None:
        raise MeshbenchError(
            "bench gauges needs an endpoint config that starts a server with metrics (llama-server) and has prompts"
        )


def run(cfg: RunConfig, levels: list[int], pairs: int, progress: Callable[[str], None] = lambda m: None) -> GaugeCost:
    """Every level's pairs, the levels' order the same each round, after one unsampled warm-up pass per level."""
    check(cfg)
    assert cfg.workload.prompts is not None  # (check)
    texts = prompts_mod.read(cfg.workload.prompts)[: cfg.workload.sessions]
    if len(texts) < cfg.workload.sessions:
        raise MeshbenchError(
            f"workload.prompts {cfg.workload.prompts}: {len(texts)} prompts for {cfg.workload.sessions} sessions"
        )
    launcher, server, model = served(cfg)
    args = [*launcher.own_flags(cfg.engine.server_argv), *cfg.engine.server_argv]
    found: dict[int, list[tuple[_Pass, _Pass]]] = {c: [] for c in levels}
    with launcher.serving(server, model, cfg.engine.server_argv) as url:
        endpoint = Endpoint(parse_target(url), apis.NATIVE.name, cfg.engine.deadline_s)
        endpoint.probe()
        ids = endpoint.tokenize(texts)
        new = cfg.workload.new_tokens
        jobs = [Job(f"s{i}", endpoint.body(ids[i], texts[i], new[i], True, cfg.workload.seed)) for i in range(len(ids))]
        for c in levels:
            closed_loop(endpoint, jobs, c)
        for r in range(pairs):
            for c in levels:
                progress(f"pair {r + 1}/{pairs}, concurrency {c}")
                first = _pass(endpoint, jobs, c, r % 2 == 0)
                second = _pass(endpoint, jobs, c, r % 2 == 1)
                found[c].append((first, second) if r % 2 == 0 else (second, first))
    return GaugeCost(
        config=cfg.source,
        server_version=launcher.version(server),
        server_args=args,
        interval_s=SAMPLE_INTERVAL_S,
        levels=[_level(c, found[c]) for c in levels],
    )
