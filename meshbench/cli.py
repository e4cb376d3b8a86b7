"""The meshbench command line. Rich output and exit codes live here and nowhere else.

Exit codes: 0 success; 1 verify found failing checks; 2 bad input (one line on
stderr naming the problem, nothing written); 130 interrupted.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from typer.core import TyperGroup

from meshbench import __version__
from meshbench.cli_bench import bench_app, model_app
from meshbench.cli_common import (
    ConfigOpt,
    DeviceOpt,
    EngineOpt,
    JsonOpt,
    ModelOpt,
    NewOpt,
    PresetOpt,
    PromptOpt,
    SeedOpt,
    SessionsOpt,
    ThreadsOpt,
    command_line,
    drop_none,
    err,
    int_list,
    out,
    print_json,
    table,
    workload_overrides,
)
from meshbench.errors import MeshbenchError


class MeshbenchGroup(TyperGroup):
    """Turns every user error into one line on stderr and exit code 2."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        try:
            rv = super().main(args=args, prog_name=prog_name or "meshbench", complete_var=complete_var,
                              standalone_mode=False, **extra)
        except typer.TyperException as e:  # typer's (vendored click's) usage errors
            ctx = getattr(e, "ctx", None)
            if type(e).__name__ == "NoArgsIsHelpError":
                rv = 0  # typer has already printed the help
            else:
                hint = f" (see '{ctx.command_path} --help')" if ctx is not None else ""
                typer.echo(f"error: {e.format_message()}{hint}", err=True)
                rv = getattr(e, "exit_code", 2)
        except MeshbenchError as e:
            typer.echo(f"error: {e}", err=True)
            rv = 2
        except (KeyboardInterrupt, typer.Abort):
            rv = 130
        if rv == 130:  # typer turns Ctrl-C into exit code 130
            typer.echo("interrupted: nothing was written", err=True)
        if not standalone_mode:
            return rv
        sys.exit(rv if isinstance(rv, int) else 0)


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
def _engine_overrides(engine, preset, model, device, threads, seed) -> dict:
    # --model alone keeps the configured engine kind: on the synthetic engine it swaps the weights.
    return {"kind": engine, "preset": preset, "model": model, "device": device, "threads": threads, "seed": seed}


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
    sessions: SessionsOpt = None,
    prompt_tokens: PromptOpt = None,
    new_tokens: NewOpt = None,
    max_prefill_tokens_per_tick: Annotated[Optional[int], typer.Option(
        "--max-prefill-tokens-per-tick", min=1, help="Prompt tokens prefilled per tick (first always runs).")] = None,
    seed: SeedOpt = None,
    out_dir: Annotated[Optional[Path], typer.Option("--out", help="Write an evidence bundle to this folder.")] = None,
    force: Annotated[bool, typer.Option("--force", help="Replace an existing bundle at --out.")] = False,
    as_json: JsonOpt = False,
    verbose: Annotated[bool, typer.Option("--verbose", help="Let llama.cpp print its own log.")] = False,
) -> None:
    """Run the same sessions at every concurrency level and prove batching never mixes them.

    With no options: the DGR-012 sweep on the synthetic engine (8 sessions, levels 1,2,4,8).
    """
    from meshbench import bundle, run  # noqa: PLC0415
    from meshbench import config as config_mod

    overrides = drop_none({
        "levels": int_list(levels, "--levels", unique=True) if levels is not None else None,
        "engine": _engine_overrides(engine, preset, model, device, threads, seed),
        "workload": workload_overrides(sessions, prompt_tokens, new_tokens, seed),
        "budget": {"max_prefill_tokens_per_tick": max_prefill_tokens_per_tick},
    })
    cfg = config_mod.load(config, overrides)
    if out_dir is not None:
        bundle.check_destination(out_dir, force)
    setup = run.prepare(cfg, verbose)
    total = sum(cfg.workload.new_tokens)
    with Progress(TextColumn("[bold]level {task.fields[level]:>3}"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("tokens"), TimeElapsedColumn(), console=err, transient=False) as progress:
        tasks: dict[int, int] = {}

        def on_tick(level: int, rec) -> None:
            if level not in tasks:
                tasks[level] = progress.add_task("", total=total, level=level)
            progress.advance(tasks[level], rec.decode_tokens + len(rec.prefill_sessions))

        data = run.run_sweep(cfg, command_line(), on_tick, setup)
    if out_dir is not None:
        written = bundle.write(out_dir, data, force)
        err.print(f"wrote {out_dir}: {', '.join(written)}")
    if as_json:
        print_json(data)
        return
    _print_sweep(data)


def _print_sweep(data: dict) -> None:
    from meshbench import report  # noqa: PLC0415

    t = table(f"{data['story']}: {data['engine']['kind']} engine, {data['workload']['sessions']} sessions",
              ("level", "ticks", "avg occ", "max occ", "tok/tick", "peak KV B", "tok/s", "ITL p50 ms"))
    for row, lv in zip(report.table_rows(data), data["levels"]):
        itl = lv["wall"]["itl_ms"]["p50"]
        t.add_row(*row, f"{lv['wall']['tokens_per_s']:.1f}", "-" if itl is None else f"{itl:.2f}")
    out.print(t)
    div = data["first_divergence"]
    out.print(f"corruption_free={data['corruption_free']} saturation_concurrency={data['saturation_concurrency']} "
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
    new_tokens: NewOpt = None,
    burst: Annotated[Optional[int], typer.Option("--burst", min=1, help="Submit N sessions shaped like the "
                                                                      "first of the workload, all at once.")] = None,
    kv_bytes: Annotated[Optional[int], typer.Option("--kv-bytes", min=1, help="Node KV budget in bytes.")] = None,
    scratch_bytes: Annotated[Optional[int], typer.Option("--scratch-bytes", min=1)] = None,
    weight_bytes: Annotated[Optional[int], typer.Option("--weight-bytes", min=1)] = None,
    max_active: Annotated[Optional[int], typer.Option("--max-active-sessions", min=1)] = None,
    max_queue_depth: Annotated[Optional[int], typer.Option("--max-queue-depth", min=0)] = None,
    max_batch_size: Annotated[Optional[int], typer.Option("--max-batch-size", min=1)] = None,
    seed: SeedOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Will these sessions fit on this node? Print every admission decision and the numbers behind it."""
    from meshbench import admission  # noqa: PLC0415
    from meshbench import config as config_mod

    overrides = drop_none({
        "engine": _engine_overrides(engine, preset, model, None, None, seed),
        "workload": workload_overrides(sessions, prompt_tokens, new_tokens, seed),
        "budget": {"kv_bytes": kv_bytes, "scratch_bytes": scratch_bytes, "weight_bytes": weight_bytes,
                   "max_active_sessions": max_active, "max_queue_depth": max_queue_depth,
                   "max_batch_size": max_batch_size},
    })
    cfg = config_mod.load(config, overrides)
    report_ = admission.run(cfg, burst)
    if as_json:
        print_json(report_)
        return
    t = table(f"admission on a node with {report_['effective_active_cap']} active slots, "
                    f"queue depth {cfg.budget['max_queue_depth']}",
              ("session", "decision", "KV needed", "KV budget", "scratch needed", "scratch budget", "active",
              "queued"))
    for d in report_["decisions"]:
        color = "green" if d["reason"] == "ADMITTED" else "yellow" if d["reason"] == "QUEUED" else "red"
        t.add_row(d["session_id"], f"[{color}]{d['reason']}[/]", str(d["kv_needed_bytes"]),
                  str(d["kv_budget_bytes"]), str(d["scratch_needed_bytes"]), str(d["scratch_budget_bytes"]),
                  f"{d['active_sessions']}/{d['active_cap']}", f"{d['queue_depth']}/{d['max_queue_depth']}")
    out.print(t)
    tel = report_["telemetry"]
    out.print(" ".join(f"{k}={v}" for k, v in tel.items()))


# --- verify -----------------------------------------------------------------------------
@app.command()
def verify(
    bundles: Annotated[list[Path], typer.Argument(help="Evidence bundle folders (each holds results.json).")],
    rerun: Annotated[bool, typer.Option("--rerun", help="Run the recorded configuration again and require every "
                                                        "deterministic field to be identical.")] = False,
) -> None:
    """Check evidence bundles: schema, recomputed figures, accounting, README table, and (--rerun) reproduction.

    Exit 0 when every check holds, 1 when any fails, 2 when a bundle cannot be used.
    """
    from meshbench import verify as verify_mod  # noqa: PLC0415

    worst = 0
    for path in bundles:
        try:
            checks = verify_mod.check_bundle(path, rerun=rerun)
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


app.add_typer(bench_app, name="bench")
app.add_typer(model_app, name="model")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
