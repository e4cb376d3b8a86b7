"""`meshbench bench ...` and `meshbench model ...`: benchmarks that print figures, and model files."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Annotated, Optional

import typer

from meshbench import limits
from meshbench.bench import (
    engine_bench,
    gguf_bench,
    hunt_bench,
    isolation_bench,
    layouts,
    scheduler_bench,
)
from meshbench.cli.common import (
    ConfigOpt,
    JsonOpt,
    PrefillOpt,
    RpcOpt,
    SeedOpt,
    ThreadsOpt,
    err,
    int_list,
    out,
    print_json,
    table,
)
from meshbench.cli.options import flag
from meshbench.engine import rpc
from meshbench.errors import MeshbenchError
from meshbench.files import regular_file, replaceable_file
from meshbench.model import gguf_io
from meshbench.model.config import preset as get_preset
from meshbench.model.weights import init_weights
from meshbench.results.markdown import median_range
from meshbench.workload import config

bench_app = typer.Typer(help="Benchmarks: commands that print figures.", no_args_is_help=True)


@bench_app.command("engine")
def bench_engine(
    preset: Annotated[str, flag("--preset", help="Synthetic model preset.")] = "bench",
    batches: Annotated[str, flag("--batches", help="Batch sizes, e.g. 1,2,4,8,16.")] = "1,2,4,8,16",
    context: Annotated[
        int, typer.Option("--context", min=1, max=limits.MAX_TOKENS, help="Cached positions per session.")
    ] = 64,
    repeats: Annotated[
        int, typer.Option("--repeats", min=1, max=10_000, help="Timed decode steps per batch size.")
    ] = 10,
    seed: SeedOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Time batched decode of the synthetic engine against a loop of single-session decodes and this machine's floor."""
    res = engine_bench.run(
        preset,
        int_list(batches, "--batches", unique=True, maximum=limits.MAX_BENCH_BATCH),
        context,
        repeats,
        seed or 0,
        progress=lambda msg: err.print(msg),
    )
    if as_json:
        print_json(dataclasses.asdict(res))
        return
    t = table(
        f"engine benchmark: preset {preset}, {res.threads} BLAS threads; bandwidth "
        f"{res.bandwidth_gb_s:.1f} GB/s, peak {res.peak_gflop_s:.1f} GFLOP/s",
        ("batch", "step ms", "tokens/s", "loop step ms", "loop tokens/s", "floor ms", "step/floor", "vs batch 1"),
    )
    for b in res.batches:
        t.add_row(
            str(b.batch),
            f"{b.step_ms:.2f}",
            f"{b.tokens_per_s:.1f}",
            f"{b.loop_step_ms:.2f}",
            f"{b.loop_tokens_per_s:.1f}",
            f"{b.floor_ms:.2f}",
            f"{b.step_over_floor:.2f}",
            f"{b.speedup_vs_batch1:.2f}x",
        )
    out.print(t)


@bench_app.command("layouts")
def bench_layouts(
    batches: Annotated[str, flag("--batches", help="Activation rows, e.g. 1,2,4,8,16.")] = "1,2,4,8,16",
    weights: Annotated[
        int, typer.Option("--weights", min=1, max=400, help="Weight matrices per pass (40 x 2048 x 768 is 252 MB).")
    ] = 40,
    shape: Annotated[str, typer.Option("--shape", help="Each weight's rows,columns (out,in).")] = "2048,768",
    as_json: JsonOpt = False,
) -> None:
    """Time matmul layouts for large float32 weights times a few rows (the choice behind linear())."""
    dims = int_list(shape, "--shape", maximum=1 << 14)
    if len(dims) != 2:
        raise MeshbenchError(f"--shape: expected two numbers (rows,columns), got {shape!r}")
    res = layouts.run(
        int_list(batches, "--batches", unique=True, maximum=limits.MAX_BENCH_BATCH), weights, (dims[0], dims[1])
    )
    if as_json:
        print_json(dataclasses.asdict(res))
        return
    names = list(res.batches[0].ms)
    t = table(
        f"{res.weights} float32 weights of {res.shape[0]} x {res.shape[1]} "
        f"({res.bytes / 1e6:.0f} MB): ms per pass, best of 5",
        ("rows", *names),
    )
    for b in res.batches:
        t.add_row(str(b.batch), *[f"{b.ms[n]:.2f}" for n in names])
    out.print(t)


@bench_app.command("scheduler")
def bench_scheduler(
    live: Annotated[
        str, typer.Option("--live", help="Live sessions (running + queued), e.g. 100,1000,16000.")
    ] = "100,1000,16000",
    batch: Annotated[
        int, typer.Option("--batch", min=1, max=limits.MAX_BENCH_BATCH, help="Running sessions (the decode batch).")
    ] = 64,
    ticks: Annotated[int, typer.Option("--ticks", min=1, max=10_000, help="Timed ticks per round.")] = 50,
    rounds: Annotated[int, flag("--rounds", min=1, max=100, help="Interleaved rounds.")] = 5,
    as_json: JsonOpt = False,
) -> None:
    """Time one scheduler tick over a do-nothing engine as the number of live sessions grows."""
    sizes = int_list(live, "--live", unique=True, maximum=limits.MAX_SESSIONS)
    if min(sizes) < batch:
        raise MeshbenchError(f"--live {min(sizes)}: fewer live sessions than the batch of {batch}")
    res = scheduler_bench.run(sizes, batch, ticks, rounds, progress=lambda msg: err.print(msg))
    if as_json:
        print_json(dataclasses.asdict(res))
        return
    t = table(
        f"scheduler tick over a do-nothing engine: batch {batch}, {res.prompt_tokens}-token prompts, "
        f"median of {rounds} x {ticks} ticks",
        ("live sessions", "ms/tick", "p10", "p90", "vs first"),
    )
    for r in res.sizes:
        t.add_row(
            str(r.live),
            f"{r.ms_per_tick_median:.3f}",
            f"{r.ms_per_tick_p10:.3f}",
            f"{r.ms_per_tick_p90:.3f}",
            f"{r.vs_first:.2f}x",
        )
    out.print(t)


@bench_app.command("gguf")
def bench_gguf(
    model: Annotated[Path, flag("--model", help="A GGUF file (e.g. make-tiny --preset bench --type q8_0).")],
    batches: Annotated[str, flag("--batches", help="Batch sizes, e.g. 1,2,4,8.")] = "1,2,4,8",
    prompt_tokens: Annotated[
        int, flag("--prompt-tokens", min=1, max=limits.MAX_TOKENS, help="Prompt length per session.")
    ] = 16,
    steps: Annotated[
        int, flag("--steps", min=2, max=limits.MAX_TOKENS, help="Timed decode steps per batch size.")
    ] = 32,
    threads: ThreadsOpt = None,
    seed: SeedOpt = None,
    rpc_workers: RpcOpt = None,
    worker_counts: Annotated[
        Optional[str],
        typer.Option(  # (its own: a list of worker counts to compare, where the table's --workers is one count)
            "--workers",
            help="Instead: the scheduler's decode tokens/s with the layers local (0) and on N spawned "
            "RPC workers, e.g. 0,1,2.",
        ),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Decode tokens/s of the GGUF engine driven by the scheduler vs a raw llama_decode loop (or vs RPC workers)."""
    if worker_counts is not None and rpc_workers:
        raise MeshbenchError("--workers spawns its own RPC workers: give --workers or --rpc, not both")
    path = regular_file(model, "model")
    sizes = int_list(batches, "--batches", unique=True, maximum=limits.MAX_LLAMA_SEQUENCES)
    if worker_counts is not None:
        counts = int_list(worker_counts, "--workers", minimum=0, unique=True, maximum=16)
        spread = gguf_bench.run_workers(
            path, counts, sizes, prompt_tokens, steps, threads, seed or 0, progress=lambda msg: err.print(msg)
        )
        if as_json:
            print_json(dataclasses.asdict(spread))
            return
        t = table(
            f"decode tokens/s through the scheduler, layers local or on RPC workers (loopback): {model}",
            ("batch", *[f"{w} workers tok/s" for w in counts], *[f"{w} workers step ms" for w in counts]),
        )
        for row in spread.batches:
            t.add_row(
                str(row.batch),
                *[f"{x.tokens_per_s:.1f}" for x in row.on],
                *[f"{x.step_ms:.2f}" for x in row.on],
            )
        out.print(t)
        return
    endpoints = rpc.parse_endpoints(rpc_workers) if rpc_workers else []
    res = gguf_bench.run(
        path, sizes, prompt_tokens, steps, threads, seed or 0, progress=lambda msg: err.print(msg), endpoints=endpoints
    )
    if as_json:
        print_json(dataclasses.asdict(res))
        return
    t = table(
        f"GGUF engine through the scheduler vs raw llama_decode: {model}",
        ("batch", "scheduler tok/s", "raw tok/s", "ratio", "raw step ms"),
    )
    for b in res.batches:
        t.add_row(
            str(b.batch),
            f"{b.scheduler_tokens_per_s:.1f}",
            f"{b.raw_tokens_per_s:.1f}",
            f"{b.ratio:.3f}",
            f"{b.raw_step_ms:.2f}",
        )
    out.print(t)


@bench_app.command("isolation")
def bench_isolation(
    config_path: ConfigOpt = None,
    levels: Annotated[str, flag("--levels", help="Concurrency levels, e.g. 1,8.")] = "1,8",
    rounds: Annotated[int, flag("--rounds", min=1, max=100, help="Interleaved rounds.")] = 5,
    prefill: PrefillOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Decode tokens/s with the engine in the node's process and in its own process, and the proxy's share."""
    overrides = {"levels": int_list(levels, "--levels", unique=True, maximum=limits.MAX_LLAMA_SEQUENCES)}
    if prefill is not None:
        overrides["prefill"] = prefill
    cfg = config.load(config_path, overrides)
    res = isolation_bench.run(cfg, list(cfg.levels), rounds, progress=lambda msg: err.print(msg))
    if as_json:
        print_json(dataclasses.asdict(res))
        return
    t = table(
        f"the engine in its own process vs in the node's ({cfg.source}; median (min-max) of {rounds} rounds)",
        (
            "concurrency",
            "in-process decode tok/s",
            "isolated decode tok/s",
            "isolated / in-process",
            "proxy us/tick",
            "proxy share of tick",
        ),
    )
    for lv in res.levels:
        t.add_row(
            str(lv.concurrency),
            median_range(lv.in_process_decode_tokens_per_s, ".1f"),
            median_range(lv.isolated_decode_tokens_per_s, ".1f"),
            median_range(lv.isolated_over_in_process, ".3f"),
            median_range(lv.proxy_us_per_tick, ".0f"),
            median_range(lv.proxy_share_of_tick, ".2%"),
        )
    out.print(t)


@bench_app.command("hunt")
def bench_hunt(
    target: Annotated[Optional[str], flag("--target", help="A running llama-server: http://HOST:PORT.")] = None,
    serve: Annotated[Optional[str], flag("--serve", help="Start llama-server for each seed.")] = None,
    config_path: Annotated[Optional[Path], flag("--config", help="meshbench's own node.")] = None,
    model: Annotated[Optional[Path], flag("--model", help="The GGUF file --serve serves.")] = None,
    package: Annotated[Optional[str], flag("--package")] = None,
    server_args: Annotated[str, flag("--server-args", help="llama-server's own flags.")] = "",
    llama_server_path: Annotated[Optional[str], flag("--llama-server", help="A llama-server binary.")] = None,
    seeds: Annotated[str, typer.Option("--seeds", help="The hunts' seeds, e.g. 0,1,2.")] = "0,1,2",
    budget_: Annotated[str, flag("--budget", help="Each hunt's budget: a time (10m) or requests.")] = "10m",
    strategies_: Annotated[str, flag("--strategies", help="Comma-separated, or all.")] = "all",
    as_json: JsonOpt = False,
) -> None:
    """Time to find: one hunt per seed, stopped at its first confident difference; each on a fresh server or node
    where meshbench starts it (--serve, --config), else on --target as it is."""
    from meshbench.cli import hunt as hunt_cli  # noqa: PLC0415 - the hunt's flags, read as the hunt reads them
    from meshbench.workload import hunt as strategies  # noqa: PLC0415

    seconds, requests = hunt_cli.budget(budget_)
    chosen = strategies.chosen(strategies_)
    seed_list = int_list(seeds, "--seeds", unique=True, minimum=0)

    def make():
        return hunt_cli.server_of(target, serve, model, package, server_args, llama_server_path, config_path)

    res = hunt_bench.run(make, chosen, seed_list, hunt_cli.until(seconds, requests), lambda m: err.print(m))
    if as_json:
        print_json(dataclasses.asdict(res))
        return
    t = table(f"time to find ({budget_} a seed, strategies {strategies_})",
              ("seed", "found", "seconds", "histories", "requests", "by strategy", "near-tie"))  # fmt: skip
    for r in res.seeds:
        t.add_row(str(r.seed), "yes" if r.found else "no", f"{r.seconds:.0f}", str(r.histories),
                  str(r.requests), r.strategy or "-", f"{r.near_tie:.3g}")  # fmt: skip
    out.print(t)
    ttf = res.time_to_find_s
    out.print(
        f"found in {res.found} of {len(seed_list)} seeds"
        + (f"; time to find median {ttf.median:.0f} s (min {ttf.min:.0f}, max {ttf.max:.0f})" if ttf else "")
    )


model_app = typer.Typer(help="Model files: make the tiny GGUF models tests and evidence use.", no_args_is_help=True)


@model_app.command("make-tiny")
def make_tiny(
    out_path: Annotated[Path, typer.Argument(help="The .gguf file to write.")],
    preset: Annotated[str, flag("--preset", help="dgr-012 | bench")] = "dgr-012",
    qtype: Annotated[str, typer.Option("--type", help="f32 | f16 | q8_0 | q4_0")] = "f32",
    seed: Annotated[int, flag("--seed", min=0, help="Weight seed (the synthetic engine's).")] = 0,
    force: Annotated[bool, flag("--force", help="Overwrite an existing file.")] = False,
) -> None:
    """Write a llama-architecture GGUF holding exactly the synthetic engine's deterministic weights."""
    cfg = get_preset(preset)
    if qtype not in gguf_io.TYPES:
        raise MeshbenchError(f"--type must be one of {', '.join(gguf_io.TYPES)}, got {qtype!r}")
    replaceable_file(out_path)  # never a device, FIFO, symlink or folder, even with --force
    if os.path.lexists(out_path) and not force:
        raise MeshbenchError(f"{out_path}: exists; pass --force to overwrite it")
    if not out_path.parent.is_dir():
        raise MeshbenchError(f"{out_path}: directory {out_path.parent} does not exist")
    size = gguf_io.write(out_path, cfg, init_weights(cfg, seed), qtype)
    err.print(f"wrote {out_path}: preset {preset}, {qtype}, seed {seed}, {cfg.n_params} parameters, {size} bytes")
