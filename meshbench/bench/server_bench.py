"""meshbench against llama.cpp's own server, on the same model, prompts and token budget: a pairing of
meshbench's node sweep with the endpoint client (meshbench.endpoint) on a server it starts.

For each level C and repetition: meshbench runs its sweep pass at concurrency C; llama-server runs
with ``-np C`` on a free loopback port, and C closed-loop clients send the same sessions (prompt
token ids, ``n_predict`` new tokens, greedy, no prompt cache, end-of-generation tokens banned on both
sides: the server's ignore_eos, meshbench's eos ban) and stream the tokens
back, stamped as they arrive. Then the server is stopped by the process id that started it. Per
level and server setting: whether every session's tokens are identical, total tokens/s (prompt +
generated over the wall time of the level), TTFT and ITL percentiles, and meshbench's figures over the
server's. Repetitions rotate the level order, and within a level the sides rotate which goes first.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from meshbench import machine
from meshbench.analysis import latency, stats
from meshbench.endpoint import llama_server
from meshbench.endpoint.client import Endpoint
from meshbench.endpoint.load import Job, closed_loop
from meshbench.endpoint.stream import Completion
from meshbench.engine import apis
from meshbench.engine.setup import EngineRecord, EngineSetup, close_engine
from meshbench.errors import MeshbenchError
from meshbench.records.context import GgufEngineInfo
from meshbench.records.model import Percentiles, SessionRecord, Summary
from meshbench.scheduler.budget import engine_limits
from meshbench.scheduler.session import GenerationRequest
from meshbench.sweep.passes import run_pass
from meshbench.sweep.plan import level_budget, level_orders
from meshbench.sweep.run import prepare
from meshbench.workload.config import RunConfig
from meshbench.workload.target import parse_target

SETTINGS = ("defaults", "aligned", "matched")


@dataclass(frozen=True, slots=True, kw_only=True)
class Pass:
    """One side's pass at one level: its tokens by session, total tokens/s, TTFT and ITL percentiles (ms), and
    (``bench prefix``) the prompt positions it computed."""

    tokens: dict[str, list[int]]
    tokens_per_s: float
    ttft_ms: Percentiles
    itl_ms: Percentiles
    computed: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Figures:
    """Each figure over the repetitions (None: a percentile some pass had no sample for)."""

    tokens_per_s: Summary
    ttft_ms_p50: Summary | None
    ttft_ms_p99: Summary | None
    itl_ms_p50: Summary | None
    itl_ms_p95: Summary | None
    itl_ms_p99: Summary | None

    @staticmethod
    def of(passes: Sequence[Pass], over: Sequence[Pass] | None = None) -> Figures:
        """Each figure's summary over ``passes``; with ``over``, of the ratios ``passes`` / ``over``, paired by
        repetition."""

        def each(figure: Callable[[Pass], float | None]) -> Summary | None:
            a = [figure(p) for p in passes]
            b = [figure(p) for p in over] if over is not None else [1.0] * len(a)
            pairs = [(x, y) for x, y in zip(a, b, strict=True) if x is not None and y is not None]
            return stats.summary([x / y for x, y in pairs]) if pairs and len(pairs) == len(a) else None

        rate = each(lambda p: p.tokens_per_s)
        assert rate is not None  # (every pass has a rate)
        return Figures(
            tokens_per_s=rate,
            ttft_ms_p50=each(lambda p: p.ttft_ms.p50),
            ttft_ms_p99=each(lambda p: p.ttft_ms.p99),
            itl_ms_p50=each(lambda p: p.itl_ms.p50),
            itl_ms_p95=each(lambda p: p.itl_ms.p95),
            itl_ms_p99=each(lambda p: p.itl_ms.p99),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class VsSetting:
    """meshbench against one server setting at one level; None throughout where that setting's server failed."""

    setting: str
    tokens_identical: bool | None  # meshbench's tokens, every repetition, are this setting's (whole answers)
    server: Figures | None
    ratio: Figures | None  # meshbench / the server, paired by repetition


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerLevel:
    concurrency: int
    meshbench: Figures
    settings: list[VsSetting]


@dataclass(frozen=True, slots=True, kw_only=True)
class RecipeUsed:
    """The recipe meshbench's llama.cpp engine ran here: each auto setting resolved, and what decided it."""

    repack: bool
    flash_attn: bool
    auto: dict[str, str]


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerBench:
    """``meshbench bench server``'s figures (``--json``: this record's fields)."""

    config: str
    server: str
    server_version: str
    repeat: int
    recipe: RecipeUsed
    settings: dict[str, list[str]]  # each setting's flags at one client
    failed: dict[str, str]  # each setting whose server failed, and why
    levels: list[ServerLevel]


def run(
    cfg: RunConfig,
    server: Path,
    levels: list[int],
    repeat: int,
    progress: Callable[[str], None] = lambda m: None,
    settings: tuple[str, ...] = ("defaults", "matched"),
) -> ServerBench:
    """meshbench's node and llama-server at each of ``settings`` (``server_args``), interleaved: within a
    repetition every side runs each level, the order of the sides rotated by the repetition. A setting whose
    server fails (its defaults may crash on this CPU) is reported with why, measured, and not run again; no
    flag is put in its place."""
    # llama-server's ignore_eos bans end-of-generation tokens: meshbench bans them too (eos: ban), so both
    # sides generate exactly max_new_tokens and pick the same argmax.
    cfg = dataclasses.replace(
        cfg, workload=dataclasses.replace(cfg.workload, eos="ban"), engine=dataclasses.replace(cfg.engine, ban_eog=True)
    )
    sides = ["meshbench", *(f"llama-server {s}" for s in settings)]
    setup = prepare(cfg)  # checks every level against the workload and the model first
    cfg = _as_resolved(cfg, setup.info)
    sliding = has_sliding_layers(setup.info)
    failed: dict[str, str] = {}

    def serve(c: int, setting: str, stream: bool) -> Pass | None:
        if setting in failed:
            return None
        try:
            return one_server(cfg, server, requests, c, setting, sliding, stream=stream)[0]
        except llama_server.NotReady as e:  # (any other error, e.g. a request's, ends the bench)
            failed[setting] = f"concurrency {c}: {e}"
            progress(f"llama-server {setting} failed: {failed[setting]}")
            return None

    try:
        requests = cfg.workload.requests(setup.vocab_size)
        _one_meshbench(cfg, setup, requests, levels[0])  # warm-up: the first pass of a process is slower
        runs: dict[int, dict[str, list[Pass]]] = {c: {s: [] for s in sides} for c in levels}
        # Each setting's tokens, from whole (not streamed) answers: a streamed answer that holds back an
        # incomplete UTF-8 byte token drops that token's id from its "tokens" (measured).
        served: dict[int, dict[str, dict[str, list[int]] | None]] = {}
        for c in levels:
            progress(f"llama-server tokens, concurrency {c}")
            served[c] = {}
            for s in settings:
                whole = serve(c, s, stream=False)
                served[c][s] = None if whole is None else whole.tokens
        if len(failed) == len(settings):
            raise MeshbenchError(
                "llama-server did not run at any setting: " + "; ".join(f"{s}: {why}" for s, why in failed.items())
            )
        for r, order in enumerate(level_orders(len(levels), repeat)):
            for i in order:
                c = levels[i]
                for side in sides[r % len(sides) :] + sides[: r % len(sides)]:
                    if side == "meshbench":
                        progress(f"repetition {r + 1}/{repeat}: {side}, concurrency {c}")
                        runs[c][side].append(_one_meshbench(cfg, setup, requests, c))
                    elif side.split()[1] not in failed:
                        progress(f"repetition {r + 1}/{repeat}: {side}, concurrency {c}")
                        got = serve(c, side.split()[1], stream=True)
                        if got is not None:
                            runs[c][side].append(got)
    finally:
        setup.close()
    return ServerBench(
        config=cfg.source,
        server=str(server),
        server_version=llama_server.version(server),
        repeat=repeat,
        recipe=_recipe(setup.info),
        settings={s: server_args(cfg, s, 1, 0, sliding) for s in settings},
        failed=failed,
        levels=[_level(c, runs[c], served[c], failed) for c in levels],
    )


def _recipe(info: EngineRecord) -> RecipeUsed:
    """The recipe meshbench's llama.cpp engine ran here: each auto setting resolved, and what decided it."""
    assert isinstance(info, GgufEngineInfo), info.kind  # (llama-server is measured beside the gguf engine only)
    return RecipeUsed(repack=info.repack, flash_attn=info.flash_attn, auto=dict(info.recipe_auto or {}))


def _as_resolved(cfg: RunConfig, engine_info: EngineRecord) -> RunConfig:
    """The config with the recipe meshbench's engine runs here (each auto setting resolved): the aligned and
    matched servers follow it."""
    assert isinstance(engine_info, GgufEngineInfo), engine_info.kind
    resolved = dataclasses.replace(cfg.engine, repack=engine_info.repack, flash_attn=engine_info.flash_attn)
    return dataclasses.replace(cfg, engine=resolved)


def _one_meshbench(cfg: RunConfig, setup: EngineSetup, requests: Sequence[GenerationRequest], c: int) -> Pass:
    budget = level_budget(cfg.budget, c, len(requests))
    engine = setup.make(engine_limits(budget))
    try:
        p = run_pass(requests, [0] * len(requests), budget, engine, prefill=cfg.prefill)
    finally:
        close_engine(engine)
    check_completed(p.sessions)
    # From the moment a session got a slot: meshbench queues every session at once, the server's closed-loop
    # clients send the next only when one finishes, so time spent queued is not comparable; a slot is.
    slots = [t.submit_ns if t.admit_ns is None else t.admit_ns for t in p.timing]
    return figures({s.session_id: s.tokens for s in p.sessions}, p.timing, slots, p.wall_s, requests)


def one_server(
    cfg: RunConfig,
    server: Path,
    requests: Sequence[GenerationRequest],
    c: int,
    setting: str,
    sliding: bool,
    stream: bool = True,
    cache_prompt: bool | None = False,
) -> tuple[Pass, list[Completion]]:
    """The server at ``-np C`` on a free loopback port, C closed-loop clients of meshbench's endpoint client:
    its figures, and the completions. ``cache_prompt`` None: not sent (the server's own default)."""
    longest = max(r.total_tokens for r in requests)
    assert cfg.engine.model is not None  # (a config that starts llama-server names its model)
    with llama_server.serving(server, cfg.engine.model, server_args(cfg, setting, c, longest, sliding)) as url:
        endpoint = Endpoint(parse_target(url), apis.NATIVE.name)
        jobs = [Job(r.session_id, _body(endpoint, r, stream, cache_prompt)) for r in requests]
        done, wall_s = closed_loop(endpoint, jobs, c)
    bad = [x for x in done if x.error]
    if bad:
        raise MeshbenchError(f"llama-server: {bad[0].session_id}: {bad[0].error}")
    check_served(done, requests, setting)
    # (a closed-loop client's request takes a slot when it is sent)
    slots = [x.submit_ns for x in done]
    return figures({x.session_id: x.tokens for x in done}, done, slots, wall_s, requests), done


def check_completed(sessions: Sequence[SessionRecord]) -> None:
    """Every meshbench session completed with every token asked for: tokens/s counts every requested token (a
    session evicted under KV pressure, for one, would be credited with tokens it never made)."""
    short = [s for s in sessions if s.done_reason != "COMPLETED" or len(s.tokens) != s.max_new_tokens]
    if short:
        x = short[0]
        raise MeshbenchError(f"meshbench: {x.session_id} ended {x.done_reason} after {len(x.tokens)} tokens")


def check_served(done: Sequence[Completion], requests: Sequence[GenerationRequest], setting: str) -> None:
    """The server ran exactly our prompt ids (it adds no BOS to ids) and says it generated every token asked for:
    tokens/s counts every requested token on both sides. (Under ignore_eos the client already refuses a short
    answer that says how long it is; this also refuses one that says nothing.)"""
    for x, r in zip(done, requests):
        if x.evaluated is not None and x.evaluated != len(r.prompt_tokens):
            raise MeshbenchError(f"the server evaluated {x.evaluated} prompt tokens, not {len(r.prompt_tokens)}")
        if x.predicted != r.max_new_tokens:
            raise MeshbenchError(
                f"llama-server {setting}: {x.session_id} generated {x.predicted} tokens, not the "
                f"{r.max_new_tokens} asked for (stop: {x.stop}): its tokens/s would count tokens it never made"
            )


def _body(endpoint: Endpoint, r: GenerationRequest, stream: bool, cache_prompt: bool | None = False) -> dict[str, Any]:
    """The endpoint client's native body: greedy, no prompt cache (``cache_prompt``: sent as given, None: not
    sent), every token generated (end-of-generation ignored, as meshbench bans it); streamed, or whole for the
    token comparison."""
    body = {**endpoint.body(list(r.prompt_tokens), "", r.max_new_tokens, True, 0), "stream": stream}
    body.pop("cache_prompt", None)  # (the endpoint's own choice: this bench sets its own)
    if cache_prompt is not None:
        body["cache_prompt"] = cache_prompt
    return body


def server_args(cfg: RunConfig, setting: str, c: int, longest: int, sliding: bool) -> list[str]:
    """The server's flags at ``setting`` for C clients.

    ``defaults``: the server as its users run it, its own defaults: C slots (-np C) and nothing else. Its
    recipe is its own (repacking where the CPU has it, its flash attention choice, its thread count, a
    window-sized cache for sliding-window layers), so its tokens may differ from meshbench's.

    ``aligned``: its defaults plus only what identical tokens need: flash attention as meshbench's recipe has
    it, the config's thread count, ``--swa-full`` for a model with sliding-window layers (meshbench's engine
    keeps llama.cpp's context default, a full-size cache for those layers; the window-sized one alone changed
    near-tie tokens on Gemma 3 at one client: measured, 3 of 16 sessions, on both llama.cpp builds here), and
    ``--no-repack`` where meshbench's engine does not repack.

    ``matched``: held to meshbench's recipe as well (``_matched_args``)."""
    if setting == "defaults":
        return ["-np", str(c)]
    identity = ["--swa-full"] if sliding else []
    if setting == "matched":
        return [*_matched_args(cfg, c, longest), *identity]
    threads = ["-t", str(cfg.engine.threads), "-tb", str(cfg.engine.threads)] if cfg.engine.threads else []
    return [
        "-np",
        str(c),
        "-fa",
        "on" if cfg.engine.flash_attn else "off",
        *threads,
        *identity,
        *([] if cfg.engine.repack else ["--no-repack"]),
    ]


def _matched_args(cfg: RunConfig, c: int, longest: int) -> list[str]:
    """The server held to meshbench's recipe: C slots each with its own cells, batches of meshbench's prefill
    budget, flash attention and the KV type as the config says, weight repacking as meshbench's engine has it."""
    batch = str(max(cfg.budget.max_prefill_tokens_per_tick, c))
    threads = str(cfg.engine.threads or machine.usable_cpus())
    return [
        "-np",
        str(c),
        "-c",
        str(c * (longest + 16)),
        "-b",
        batch,
        "-ub",
        batch,
        "-fa",
        "on" if cfg.engine.flash_attn else "off",
        "-ctk",
        cfg.engine.kv_type,
        "-ctv",
        cfg.engine.kv_type,
        "--kv-unified" if cfg.engine.kv_unified else "--no-kv-unified",
        "-t",
        threads,
        "-tb",
        threads,
        *([] if cfg.engine.repack else ["--no-repack"]),
    ]


def figures(
    tokens: dict[str, list[int]],
    stamps: Sequence[latency.Stamped],
    slots: Sequence[int],
    wall_s: float,
    requests: Sequence[GenerationRequest],
) -> Pass:
    """A side's tokens, total tokens/s, and TTFT (from the moment a slot took the session) and ITL."""
    # Both sides generate exactly max_new_tokens per session (the server ignores EOS; one_server checks what
    # it says it generated, and meshbench bans EOS).
    total = sum(r.total_tokens for r in requests)
    lat = latency.samples(stamps, slots)
    return Pass(
        tokens=tokens,
        tokens_per_s=total / wall_s if wall_s > 0 else 0.0,
        ttft_ms=latency.percentile_record(lat.ttft),
        itl_ms=latency.percentile_record(lat.itl),
    )


def _level(
    c: int, runs: dict[str, list[Pass]], served: dict[str, dict[str, list[int]] | None], failed: dict[str, str]
) -> ServerLevel:
    """meshbench's figures, and against each server setting: whether meshbench's tokens are that setting's, the
    server's figures, and meshbench over the server's (paired by repetition); None where the setting failed."""
    mesh = runs["meshbench"]
    vs = []
    for s, ref in served.items():
        srv = runs[f"llama-server {s}"]
        ran = s not in failed and len(srv) == len(mesh)  # (a failed setting: no pairs to compare)
        vs.append(
            VsSetting(
                setting=s,
                tokens_identical=None if ref is None or s in failed else all(m.tokens == ref for m in mesh),
                server=Figures.of(srv) if ran else None,
                ratio=Figures.of(mesh, over=srv) if ran else None,
            )
        )
    return ServerLevel(concurrency=c, meshbench=Figures.of(mesh), settings=vs)


def has_sliding_layers(info: EngineRecord) -> bool:
    """Whether the model has sliding-window layers (llama.cpp's engine record says; meshbench's own has none)."""
    geometry = info.kv_geometry if isinstance(info, GgufEngineInfo) else None
    return geometry is not None and any(w is not None for w in geometry.window)
