"""The meshbench command line. Rich output and exit codes live here and nowhere else.

Exit codes: 0 success; 1 verify found failing checks; 2 bad input (one line on
stderr naming the problem, nothing written); 130 interrupted.
"""

from __future__ import annotations

import errno
import functools
import io
import signal
import sys
import threading
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from typer.core import TyperGroup

from meshbench import __version__, limits
from meshbench.cli import compare as cli_compare
from meshbench.cli.bench import bench_app, model_app
from meshbench.cli.common import (
    ArrivalsOpt,
    ClockOpt,
    ConfigOpt,
    DeviceOpt,
    EngineOpt,
    EosOpt,
    InjectOpt,
    IsolateOpt,
    IsolationOpt,
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
    SessionsOpt,
    SloTpotOpt,
    SloTtftOpt,
    SplitOpt,
    ThreadsOpt,
    TiledOpt,
    WarmupOpt,
    WorkersOpt,
    command_line,
    drop_none,
    err,
    float_list,
    int_list,
    out,
    print_json,
    table,
    workload_overrides,
)
from meshbench.cli.node import node_app
from meshbench.errors import MeshbenchError
from meshbench.results import bundle, report
from meshbench.sweep import admit as admission
from meshbench.sweep import run
from meshbench.verify import bundle as verify_mod
from meshbench.workload import config as config_mod


class Terminated(BaseException):
    """SIGTERM, raised like KeyboardInterrupt so that every ``finally`` cleans up."""


def _on_sigterm(signum, frame):  # noqa: ARG001
    raise Terminated()


class _ClosedStream(io.TextIOBase):
    """Stands in for a closed standard output: writing to it is an error, not an AttributeError."""

    def write(self, s):  # noqa: ARG002
        raise OSError(errno.EBADF, "standard output is closed")

    def fileno(self) -> int:
        raise OSError(errno.EBADF, "standard output is closed")

    def isatty(self) -> bool:
        return False


OUTPUT_ERRORS = (errno.ENOSPC, errno.EFBIG, errno.EPIPE, errno.EBADF, errno.EIO, errno.EDQUOT)


class MeshbenchGroup(TyperGroup):
    """Turns every user error into one line on stderr and exit code 2.

    Exit codes: 2 bad input or output that could not be written, 130 SIGINT, 143 SIGTERM.
    """

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        if sys.stdout is None:
            sys.stdout = _ClosedStream()
        previous = _install_sigterm()
        try:
            rv = self._run(args, prog_name, complete_var, **extra)
            try:
                sys.stdout.flush()  # a main output that could not be written is a failure, not exit 0
            except OSError as e:
                rv = _output_error(e)
        finally:
            if previous is not None:
                signal.signal(signal.SIGTERM, previous)
        if not standalone_mode:
            return rv
        sys.exit(rv if isinstance(rv, int) else 0)

    def _run(self, args, prog_name, complete_var, **extra) -> int:
        try:
            rv = super().main(args=args, prog_name=prog_name or "meshbench", complete_var=complete_var,
                              standalone_mode=False, **extra)
            if rv == 130:  # typer turns Ctrl-C into exit code 130 itself
                typer.echo("interrupted: no partial bundle or file was left", err=True)
            return rv
        except typer.TyperException as e:  # typer's (vendored click's) usage errors
            ctx = getattr(e, "ctx", None)
            if type(e).__name__ == "NoArgsIsHelpError":
                return 0  # typer has already printed the help
            hint = f" (see '{ctx.command_path} --help')" if ctx is not None else ""
            typer.echo(f"error: {e.format_message()}{hint}", err=True)
            return getattr(e, "exit_code", 2)
        except MeshbenchError as e:
            typer.echo(f"error: {e}", err=True)
            return 2
        except (KeyboardInterrupt, typer.Abort):
            typer.echo("interrupted: no partial bundle or file was left", err=True)
            return 130
        except Terminated:
            typer.echo("terminated (SIGTERM): no partial bundle or file was left", err=True)
            return 143
        except OSError as e:
            if e.errno in OUTPUT_ERRORS:
                return _output_error(e)
            if e.errno in PATH_ERRORS:  # a path the file system cannot hold: the user's input, one line
                name = e.filename if e.filename is not None else ""
                shown = str(name)[:80] + ("..." if len(str(name)) > 80 else "")
                typer.echo(f"error: {shown}: {e.strerror}", err=True)
                return 2
            raise


# A name too long, a file where a folder should be, a loop of links: the path given was impossible.
PATH_ERRORS = {errno.ENAMETOOLONG, errno.ENOTDIR, errno.ELOOP, errno.EISDIR}


def _output_error(e: OSError) -> int:
    try:
        typer.echo(f"error: cannot write the output: {e.strerror or e}", err=True)
    except (OSError, ValueError, AttributeError):
        pass
    return 2


def _install_sigterm():
    """SIGTERM cleans up like Ctrl-C; only the main thread may set a handler."""
    if threading.current_thread() is not threading.main_thread():
        return None
    return signal.signal(signal.SIGTERM, _on_sigterm)


app = typer.Typer(
    cls=MeshbenchGroup, add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
    help="Reproducible evidence for how an LLM inference node schedules concurrent sessions.",
)


def _version(value: bool) -> None:
    if value:
        out.print(f"meshbench {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[Optional[bool], typer.Option("--version", callback=_version, is_eager=True,
                                                    help="Print the version and exit.")] = None,
) -> None:
    pass


# --- flag parsing -----------------------------------------------------------------------
def _engine_overrides(engine, preset, model, device, threads, seed, rpc=None, workers=None) -> dict:
    # --model alone keeps the configured engine kind: on the synthetic engine it swaps the weights.
    return {"kind": engine, "preset": preset, "model": model, "device": device, "threads": threads, "seed": seed,
            "rpc": rpc, "workers": workers}


@app.command()
def sweep(
    config: ConfigOpt = None,
    levels: Annotated[Optional[str], typer.Option(
        "--levels", help="Concurrency levels, e.g. 1,2,4,8. Each must be >= 1 and at most the session count: "
                         "a higher level is refused, not clamped.")] = None,
    engine: EngineOpt = None,
    preset: PresetOpt = None,
    model: ModelOpt = None,
    device: DeviceOpt = None,
    threads: ThreadsOpt = None,
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
    inject: InjectOpt = None,
    restart_engine: RestartOpt = None,
    sessions: SessionsOpt = None,
    prompt_tokens: PromptOpt = None,
    prompts: PromptsOpt = None,
    new_tokens: NewOpt = None,
    max_prefill_tokens_per_tick: Annotated[Optional[int], typer.Option(
        "--max-prefill-tokens-per-tick", rich_help_panel="Workload", min=1, max=limits.MAX_TOKENS,
        help="Prompt tokens prefilled per tick (first always runs).")] = None,
    seed: SeedOpt = None,
    arrivals: ArrivalsOpt = None,
    rates: RatesOpt = None,
    max_queue_depth: QueueOpt = None,
    slo_ttft: SloTtftOpt = None,
    slo_tpot: SloTpotOpt = None,
    clock: ClockOpt = None,
    repeat: RepeatOpt = None,
    warmup: WarmupOpt = None,
    out_dir: Annotated[Optional[Path], typer.Option("--out", rich_help_panel="Output",
                                                    help="Write an evidence bundle to this folder.")] = None,
    force: Annotated[bool, typer.Option("--force", rich_help_panel="Output",
                                        help="Replace an existing bundle at --out.")] = False,
    as_json: JsonOpt = False,
    verbose: Annotated[bool, typer.Option("--verbose", rich_help_panel="Output",
                                          help="Let llama.cpp print its own log.")] = False,
) -> None:
    """Run the same sessions at every concurrency level and prove batching never mixes them.

    With no options: the DGR-012 sweep on the synthetic engine (8 sessions, levels 1,2,4,8).
    """
    _sweep(config_mod.load(config, _sweep_overrides(**locals())), out_dir, force, as_json, verbose)


def _sweep_overrides(levels, repeat, warmup, rates, slo_ttft, slo_tpot, clock, inject, restart_engine, prefill,
                     isolation, engine, preset, model, device, threads, seed, rpc, workers, split, isolate,
                     mixed_batch, repack, tiled_mm, sessions, prompt_tokens, new_tokens, arrivals, prompts, eos,
                     max_prefill_tokens_per_tick, max_queue_depth, **_) -> dict:
    """The sweep's flags as a nested config mapping (only the flags given)."""
    return drop_none({
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
        "engine": dict(_engine_overrides(engine, preset, model, device, threads, seed, rpc, workers),
                       split=float_list(split, "--split", unique=False) if split is not None else None,
                       isolate=isolate, mixed_batch=mixed_batch, repack=repack, tiled_mm=tiled_mm),
        "workload": dict(workload_overrides(sessions, prompt_tokens, new_tokens, seed, arrivals, prompts), eos=eos),
        "budget": {"max_prefill_tokens_per_tick": max_prefill_tokens_per_tick, "max_queue_depth": max_queue_depth},
    })


def _sweep(cfg: config_mod.RunConfig, out_dir: Path | None, force: bool, as_json: bool, verbose: bool) -> None:
    staging = bundle.prepare(out_dir, force) if out_dir is not None else None
    try:
        data = _run_with_progress(cfg, verbose)
        if out_dir is not None:
            err.print(f"wrote {out_dir}: {', '.join(bundle.commit(staging, out_dir, data, force))}", markup=False)
            staging = None
    finally:
        bundle.discard(staging)
    print_json(data) if as_json else _print_sweep(data)
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
    with Progress(TextColumn("[bold]level {task.fields[level]:>3}"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("tokens"), TimeElapsedColumn(), console=err, transient=False) as progress:
        tasks: dict[int, int] = {}

        def on_tick(level: int, rec) -> None:
            if level not in tasks:
                tasks[level] = progress.add_task("", total=total, level=level)
            progress.advance(tasks[level], rec.decode_tokens + len(rec.prefill_sessions))

        return run.sweep_on_node(cfg, command_line(), on_tick, verbose)


def _print_sweep(data: dict) -> None:
    t = table(f"{data['story']}: {data['engine']['kind']} engine, {data['workload']['sessions']} sessions, "
              f"{data['config']['repeat']} repetition(s): medians",
              ("level", "ticks", "avg occ", "max occ", "tok/tick", "peak KV B", "tok/s", "decode tok/s",
               "ITL p50 ms"))
    for row, lv in zip(report.table_rows(data), data["levels"]):
        wall = lv["wall"]
        itl = wall.get("itl_ms.p50")
        t.add_row(*row, f"{wall['tokens_per_s']['median']:.1f}", f"{wall['decode_tokens_per_s']['median']:.1f}",
                  "-" if itl is None else f"{itl['median']:.2f}")
    out.print(t)
    div = data["first_divergence"]
    out.print(f"corruption_free={data['corruption_free']} batch_invariant={data['batch_invariant']} "
              f"isolation={data['isolation']['holds']} ({data['isolation']['levels_run']} of {len(data['levels'])} "
              f"levels) saturation_concurrency={data['saturation_concurrency']} "
              f"cache_misses={sum(lv['cache_misses'] for lv in data['levels'])} "
              f"rejected_admissions={sum(lv['rejected_admissions'] for lv in data['levels'])} "
              f"failed={sum(lv['failed'] for lv in data['levels'])}")
    if div:
        out.print(f"first divergence: {div}")


# --- admit ------------------------------------------------------------------------------
@app.command()
def admit(
    config: ConfigOpt = None,
    engine: EngineOpt = None,
    preset: PresetOpt = None,
    model: ModelOpt = None,
    sessions: SessionsOpt = None,
    prompt_tokens: PromptOpt = None,
    prompts: PromptsOpt = None,
    new_tokens: NewOpt = None,
    burst: Annotated[Optional[int], typer.Option(
        "--burst", min=1, max=limits.MAX_SESSIONS,
        help="Submit N sessions shaped like the first of the workload.")] = None,
    arrivals: ArrivalsOpt = None,
    rpc: RpcOpt = None,
    workers: WorkersOpt = None,
    kv_bytes: Annotated[Optional[int], typer.Option("--kv-bytes", min=1, max=limits.MAX_BYTES,
                                                    help="Node KV budget in bytes.")] = None,
    scratch_bytes: Annotated[Optional[int], typer.Option("--scratch-bytes", min=1, max=limits.MAX_BYTES)] = None,
    weight_bytes: Annotated[Optional[int], typer.Option("--weight-bytes", min=1, max=limits.MAX_BYTES)] = None,
    max_active: Annotated[Optional[int], typer.Option("--max-active-sessions", min=1,
                                                      max=limits.MAX_SESSIONS)] = None,
    max_queue_depth: Annotated[Optional[int], typer.Option("--max-queue-depth", min=0,
                                                           max=limits.MAX_SESSIONS)] = None,
    max_batch_size: Annotated[Optional[int], typer.Option("--max-batch-size", min=1,
                                                          max=limits.MAX_SESSIONS)] = None,
    seed: SeedOpt = None,
    prefill: PrefillOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Will these sessions fit on this node? Print every admission decision and the numbers behind it."""
    overrides = drop_none({
        "prefill": prefill,
        "engine": _engine_overrides(engine, preset, model, None, None, seed, rpc, workers),
        "workload": workload_overrides(sessions, prompt_tokens, new_tokens, seed, arrivals, prompts),
        "budget": {"kv_bytes": kv_bytes, "scratch_bytes": scratch_bytes, "weight_bytes": weight_bytes,
                   "max_active_sessions": max_active, "max_queue_depth": max_queue_depth,
                   "max_batch_size": max_batch_size},
    })
    cfg = config_mod.load(config, overrides)
    result = admission.run(cfg, burst)
    if as_json:
        print_json(result)
        return
    t = table(f"admission on a node with {result['effective_active_cap']} active slots, "
              f"queue depth {cfg.budget.max_queue_depth}, arrivals {result['arrivals']}",
              ("tick", "session", "decision", "KV needed", "KV budget", "scratch needed", "scratch budget", "active",
               "queued"))
    for d in result["decisions"]:
        color = "green" if d["reason"] == "ADMITTED" else "yellow" if d["reason"] == "QUEUED" else "red"
        t.add_row(str(d["tick"]), d["session_id"], f"[{color}]{d['reason']}[/]", str(d["kv_needed_bytes"]),
                  str(d["kv_budget_bytes"]), str(d["scratch_needed_bytes"]), str(d["scratch_budget_bytes"]),
                  f"{d['active_sessions']}/{d['active_cap']}", f"{d['queue_depth']}/{d['max_queue_depth']}")
    out.print(t)
    tel = result["telemetry"]
    out.print(" ".join(f"{k}={v}" for k, v in tel.items()))


# --- verify -----------------------------------------------------------------------------
@app.command()
def verify(
    bundles: Annotated[list[Path], typer.Argument(help="Evidence bundle folders (each holds results.json).")],
    rerun: Annotated[bool, typer.Option("--rerun", help="Run the recorded configuration again and require every "
                                                        "deterministic field to be identical.")] = False,
    trust_endpoints: Annotated[bool, typer.Option(
        "--trust-endpoints", help="Let --rerun connect to the RPC endpoints a bundle names (engine.rpc); without "
                                  "it such a bundle is refused: a rerun would send the model to them.")] = False,
) -> None:
    """Check evidence bundles: schema, recomputed figures and verdicts, the README, and (--rerun) reproduction.

    Exit 0 when every check holds, 1 when any fails, 2 when a bundle cannot be used.
    """
    worst = 0
    for path in bundles:  # every bundle is reported; the exit code is the worst status
        try:
            checks = verify_mod.check_bundle(
                path, rerun=functools.partial(run.rerun_results, trust_endpoints=trust_endpoints, bundle=path)
                if rerun else None)
        except MeshbenchError as e:
            err.print(f"error: {e}", markup=False)
            worst = max(worst, 2)
            continue
        for f in checks.failures:
            out.print(f"{path}/{f}", markup=False)
        status = "FAIL" if checks.failures else "ok"
        out.print(f"{path}: {status}: {checks.count} checks, {len(checks.failures)} failed"
                  + (" (rerun included)" if rerun else ""), markup=False)
        if checks.failures:
            worst = max(worst, 1)
    raise typer.Exit(worst)


app.command("compare")(cli_compare.compare)
app.add_typer(bench_app, name="bench")
app.add_typer(node_app, name="node")
app.add_typer(model_app, name="model")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
