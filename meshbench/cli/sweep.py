"""``meshbench sweep``: the same sessions at every concurrency level, and the evidence that batching
never mixed them."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from meshbench import limits
from meshbench.cli.common import (
    AllowRemoteOpt,
    ApiOpt,
    ArrivalsOpt,
    ClockOpt,
    ConfigOpt,
    DeviceOpt,
    EngineOpt,
    EosOpt,
    InjectOpt,
    IsolateOpt,
    IsolationOpt,
    IsolationRoundsOpt,
    JsonOpt,
    MixedOpt,
    ModelOpt,
    NewOpt,
    PrefillOpt,
    PresetOpt,
    PromptOpt,
    PromptsOpt,
    QueueOpt,
    RatesOpt,
    RepackOpt,
    RepeatOpt,
    RestartOpt,
    RpcOpt,
    SeedOpt,
    ServeOpt,
    ServerArgsOpt,
    SessionsOpt,
    SloTpotOpt,
    SloTtftOpt,
    SplitOpt,
    TargetOpt,
    ThreadsOpt,
    TiledOpt,
    WarmupOpt,
    WorkersOpt,
    command_line,
    drop_none,
    engine_overrides,
    err,
    float_list,
    int_list,
    out,
    print_json,
    table,
    workload_overrides,
)
from meshbench.endpoint import sweep as endpoint_sweep
from meshbench.errors import MeshbenchError
from meshbench.results import bundle, envinfo, report
from meshbench.results.endpoint_report import cell
from meshbench.sweep import run
from meshbench.verify import bundle as verify_mod
from meshbench.workload import config as config_mod


def sweep(
    config: ConfigOpt = None,
    levels: Annotated[
        Optional[str],
        typer.Option(
            "--levels",
            help="Concurrency levels, e.g. 1,2,4,8. Each must be >= 1 and at most the session count: "
            "a higher level is refused, not clamped.",
        ),
    ] = None,
    engine: EngineOpt = None,
    preset: PresetOpt = None,
    model: ModelOpt = None,
    device: DeviceOpt = None,
    threads: ThreadsOpt = None,
    target: TargetOpt = None,
    serve: ServeOpt = None,
    server_args: ServerArgsOpt = None,
    api: ApiOpt = None,
    rpc: RpcOpt = None,
    workers: WorkersOpt = None,
    split: SplitOpt = None,
    isolate: IsolateOpt = None,
    mixed_batch: MixedOpt = None,
    repack: RepackOpt = None,
    tiled_mm: TiledOpt = None,
    prefill: PrefillOpt = None,
    eos: EosOpt = None,
    isolation: IsolationOpt = None,
    isolation_rounds: IsolationRoundsOpt = None,
    allow_remote: AllowRemoteOpt = None,
    inject: InjectOpt = None,
    restart_engine: RestartOpt = None,
    sessions: SessionsOpt = None,
    prompt_tokens: PromptOpt = None,
    prompts: PromptsOpt = None,
    new_tokens: NewOpt = None,
    max_prefill_tokens_per_tick: Annotated[
        Optional[int],
        typer.Option(
            "--max-prefill-tokens-per-tick",
            rich_help_panel="Workload",
            min=1,
            max=limits.MAX_TOKENS,
            help="Prompt tokens prefilled per tick (first always runs).",
        ),
    ] = None,
    seed: SeedOpt = None,
    arrivals: ArrivalsOpt = None,
    rates: RatesOpt = None,
    max_queue_depth: QueueOpt = None,
    slo_ttft: SloTtftOpt = None,
    slo_tpot: SloTpotOpt = None,
    clock: ClockOpt = None,
    repeat: RepeatOpt = None,
    warmup: WarmupOpt = None,
    out_dir: Annotated[
        Optional[Path], typer.Option("--out", rich_help_panel="Output", help="Write an evidence bundle to this folder.")
    ] = None,
    force: Annotated[
        bool, typer.Option("--force", rich_help_panel="Output", help="Replace an existing bundle at --out.")
    ] = False,
    as_json: JsonOpt = False,
    verbose: Annotated[
        bool, typer.Option("--verbose", rich_help_panel="Output", help="Let llama.cpp print its own log.")
    ] = False,
) -> None:
    """Run the same sessions at every concurrency level and prove batching never mixes them.

    With no options: the DGR-012 sweep on the synthetic engine (8 sessions, levels 1,2,4,8).
    """
    _sweep(config_mod.load(config, _sweep_overrides(**locals())), out_dir, force, as_json, verbose)


def _sweep_overrides(
    levels,
    repeat,
    warmup,
    rates,
    slo_ttft,
    slo_tpot,
    clock,
    inject,
    restart_engine,
    prefill,
    isolation,
    isolation_rounds,
    allow_remote,
    engine,
    preset,
    model,
    device,
    threads,
    seed,
    target,
    serve,
    server_args,
    api,
    rpc,
    workers,
    split,
    isolate,
    mixed_batch,
    repack,
    tiled_mm,
    sessions,
    prompt_tokens,
    new_tokens,
    arrivals,
    prompts,
    eos,
    max_prefill_tokens_per_tick,
    max_queue_depth,
    **_,
) -> dict:
    """The sweep's flags as a nested config mapping (only the flags given)."""
    if target is not None and serve is not None:
        raise MeshbenchError("give --target (a server you run) or --serve (one meshbench starts), not both")
    return drop_none(
        {
            "levels": int_list(levels, "--levels", unique=True) if levels is not None else None,
            "repeat": repeat,
            "warmup": warmup,
            "rates": float_list(rates, "--rates") if rates is not None else None,
            "slo": {"ttft": slo_ttft, "tpot": slo_tpot},
            "clock": clock,
            "faults": list(inject) if inject else None,
            "restart_engine": restart_engine,
            "prefill": prefill,
            "isolation": isolation,
            "isolation_rounds": isolation_rounds,
            "engine": dict(
                engine_overrides(engine, preset, model, device, threads, seed, rpc, workers),
                split=float_list(split, "--split", unique=False) if split is not None else None,
                isolate=isolate,
                mixed_batch=mixed_batch,
                repack=repack,
                tiled_mm=tiled_mm,
                **({"kind": "endpoint", "url": target} if target is not None else {}),
                allow_remote=allow_remote,
                **({"kind": "endpoint", "serve": serve} if serve is not None else {}),
                server_args=server_args,
                api=api,
            ),
            "workload": dict(workload_overrides(sessions, prompt_tokens, new_tokens, seed, arrivals, prompts), eos=eos),
            "budget": {"max_prefill_tokens_per_tick": max_prefill_tokens_per_tick, "max_queue_depth": max_queue_depth},
        }
    )


def _sweep(cfg: config_mod.RunConfig, out_dir: Path | None, force: bool, as_json: bool, verbose: bool) -> None:
    if out_dir is not None:
        bundle.prepare(out_dir, force)
    data = _run_endpoint(cfg) if cfg.engine.kind == "endpoint" else _run_with_progress(cfg, verbose)
    if out_dir is not None:
        err.print(f"wrote {out_dir}: {', '.join(bundle.commit(out_dir, data, force))}", markup=False)
    if as_json:
        print_json(data)
    else:
        _print_endpoint(data) if data.get("kind") == "endpoint" else _print_sweep(data)
    _check_own_evidence(data)


def _check_own_evidence(data: dict) -> None:
    """A sweep whose evidence would not pass verify says why and exits 1 (its bundle is kept)."""
    failures = verify_mod.check_data(data).failures
    if failures:
        for f in failures:
            err.print(f"sweep: {f}", markup=False)
        err.print(f"sweep: the evidence fails {len(failures)} checks that verify makes", markup=False)
        raise typer.Exit(1)


def _run_with_progress(cfg, verbose: bool) -> dict:
    """A progress bar on a terminal; elsewhere (a pipe, a CI log) one line as each level starts."""
    if not err.is_terminal:
        started: set[int] = set()

        def on_line(level: int, rec) -> None:  # noqa: ARG001
            if level not in started:
                started.add(level)
                err.print(f"sweep: level {level} started", markup=False)

        return run.sweep_on_node(cfg, command_line(), on_line, verbose)
    total = sum(cfg.workload.new_tokens) * (cfg.repeat + cfg.warmup)
    with Progress(
        TextColumn("[bold]level {task.fields[level]:>3}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("tokens"),
        TimeElapsedColumn(),
        console=err,
        transient=False,
    ) as progress:
        tasks: dict[int, int] = {}

        def on_tick(level: int, rec) -> None:
            if level not in tasks:
                tasks[level] = progress.add_task("", total=total, level=level)
            progress.advance(tasks[level], rec.decode_tokens + len(rec.prefill_sessions))

        return run.sweep_on_node(cfg, command_line(), on_tick, verbose)


def _print_sweep(data: dict) -> None:
    t = table(
        f"{data['story']}: {data['engine']['kind']} engine, {data['workload']['sessions']} sessions, "
        f"{data['config']['repeat']} repetition(s): medians",
        ("level", "ticks", "avg occ", "max occ", "tok/tick", "peak KV B", "tok/s", "decode tok/s", "ITL p50 ms"),
    )
    for row, lv in zip(report.table_rows(data), data["levels"]):
        wall = lv["wall"]
        itl = wall.get("itl_ms.p50")
        t.add_row(
            *row,
            f"{wall['tokens_per_s']['median']:.1f}",
            f"{wall['decode_tokens_per_s']['median']:.1f}",
            "-" if itl is None else f"{itl['median']:.2f}",
        )
    out.print(t)
    div = data["first_divergence"]
    out.print(
        f"corruption_free={data['corruption_free']} batch_invariant={data['batch_invariant']} "
        f"isolation={data['isolation']['holds']} ({data['isolation']['levels_run']} of {len(data['levels'])} "
        f"levels) saturation_concurrency={data['saturation_concurrency']} "
        f"cache_misses={sum(lv['cache_misses'] for lv in data['levels'])} "
        f"rejected_admissions={sum(lv['rejected_admissions'] for lv in data['levels'])} "
        f"failed={sum(lv['failed'] for lv in data['levels'])}"
    )
    if div:
        out.print(f"first divergence: {div}")


def _run_endpoint(cfg: config_mod.RunConfig) -> dict:
    """The endpoint sweep, one progress line per pass on stderr."""
    return endpoint_sweep.run(
        cfg, command_line(), envinfo.environment(), lambda m: err.print(f"sweep: {m}", markup=False)
    )


def _print_endpoint(data: dict) -> None:
    v = data["verdicts"]
    t = table(
        f"{data['story']}: {data['endpoint']['server']} at {data['endpoint']['url']} ({data['endpoint']['api']} API), "
        f"{data['workload']['sessions']} sessions, {len(data['levels'][0]['repetitions'])} repetition(s): medians",
        (
            "level",
            "differ from C=ref",
            "max distinct",
            "needle distinct",
            "tok/s",
            "TTFT p50 ms",
            "ITL p50 ms",
            "ITL p99 ms",
        ),
    )
    for lv in data["levels"]:
        c, f = str(lv["concurrency"]), lv["figures"]
        t.add_row(
            c,
            str(len(v["differing_sessions"][c])),
            str(max(v["distinct_outputs"][c].values(), default=0)),
            str(v["needle"][c]["distinct"]),
            cell(f["tokens_per_s"]),
            cell(f["ttft_ms.p50"]),
            cell(f["itl_ms.p50"]),
            cell(f["itl_ms.p99"]),
        )
    out.print(t)
    out.print(
        f"compared={v['compared']} batch_invariant={v['batch_invariant']} "
        f"run_to_run_deterministic={v['run_to_run_deterministic']} needle_stable={v['needle_stable']}"
    )
