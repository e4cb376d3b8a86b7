"""The meshbench command line. Rich output and exit codes live here and nowhere else.

Exit codes: 0 success; 1 verify found failing checks; 2 bad input (one line on
stderr naming the problem, nothing written); 130 interrupted.
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from typer.core import TyperGroup

from meshbench import __version__
from meshbench.errors import MeshbenchError

# Piped output keeps full-width tables instead of rich's 80-column fallback.
out = Console(highlight=False, soft_wrap=True, width=None if sys.stdout.isatty() else 160)
err = Console(stderr=True, highlight=False, soft_wrap=True, width=None if sys.stderr.isatty() else 160)


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
def int_list(value: str, flag: str, minimum: int = 1, unique: bool = False) -> list[int]:
    if value is None or not value.strip():
        raise MeshbenchError(f"{flag}: empty; expected comma-separated integers such as 1,2,4,8")
    items = []
    for part in value.split(","):
        part = part.strip()
        if not part:
            raise MeshbenchError(f"{flag}: empty entry in {value!r}")
        try:
            n = int(part)
        except ValueError:
            raise MeshbenchError(f"{flag}: {part!r} is not an integer") from None
        if n < minimum:
            raise MeshbenchError(f"{flag}: {n} is below the minimum {minimum}")
        if unique and n in items:
            raise MeshbenchError(f"{flag}: {n} appears twice in {value!r}")
        items.append(n)
    return items


def per_session(value: str | None, flag: str):
    if value is None:
        return None
    items = int_list(value, flag)
    return items[0] if len(items) == 1 else items


def _drop_none(d: dict) -> dict:
    out_ = {}
    for k, v in d.items():
        if isinstance(v, dict):
            v = _drop_none(v)
            if v:
                out_[k] = v
        elif v is not None:
            out_[k] = v
    return out_


def _command() -> str:
    return " ".join(shlex.quote(a) for a in ["meshbench", *sys.argv[1:]])


# --- sweep ------------------------------------------------------------------------------
ConfigOpt = Annotated[Optional[Path], typer.Option("--config", help="YAML run config (see configs/).")]
EngineOpt = Annotated[Optional[str], typer.Option("--engine", help="synthetic | gguf")]
PresetOpt = Annotated[Optional[str], typer.Option("--preset", help="Synthetic model preset: dgr-012 | bench.")]
ModelOpt = Annotated[Optional[str], typer.Option("--model", help="A GGUF file (gguf engine, or synthetic "
                                                                 "engine reading its weights).")]
DeviceOpt = Annotated[Optional[str], typer.Option("--device", help="cpu | cuda | auto")]
ThreadsOpt = Annotated[Optional[int], typer.Option("--threads", min=1, help="Engine threads (gguf engine).")]
SessionsOpt = Annotated[Optional[int], typer.Option("--sessions", min=1, help="Number of sessions.")]
PromptOpt = Annotated[Optional[str], typer.Option("--prompt-tokens",
                                                  help="Prompt length: one number, or one per session (4,8,...).")]
NewOpt = Annotated[Optional[str], typer.Option("--new-tokens", help="New tokens: one number, or one per session.")]
SeedOpt = Annotated[Optional[int], typer.Option("--seed", min=0, help="Seed of the prompts and of synthetic weights.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON on stdout and nothing else.")]


def _engine_overrides(engine, preset, model, device, threads, seed) -> dict:
    eng = {"kind": engine, "preset": preset, "model": model, "device": device, "threads": threads, "seed": seed}
    if model is not None and engine is None and preset is None:
        eng["kind"] = eng.get("kind")  # keep the configured kind; --model alone swaps the weights
    return eng


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
        "--max-prefill-tokens-per-tick", min=1, help="Prompt tokens prefilled per tick (the first always runs).")] = None,
    seed: SeedOpt = None,
    out_dir: Annotated[Optional[Path], typer.Option("--out", help="Write an evidence bundle to this folder.")] = None,
    force: Annotated[bool, typer.Option("--force", help="Replace an existing bundle at --out.")] = False,
    as_json: JsonOpt = False,
    verbose: Annotated[bool, typer.Option("--verbose", help="Let llama.cpp print its own log.")] = False,
) -> None:
    """Run the same sessions at every concurrency level and prove batching never mixes them.

    With no options: the DGR-012 sweep on the synthetic engine (8 sessions, levels 1,2,4,8).
    """
    from meshbench import bundle, config as config_mod, run  # noqa: PLC0415

    overrides = _drop_none({
        "levels": int_list(levels, "--levels", unique=True) if levels is not None else None,
        "engine": _engine_overrides(engine, preset, model, device, threads, seed),
        "workload": {"sessions": sessions, "prompt_tokens": per_session(prompt_tokens, "--prompt-tokens"),
                     "new_tokens": per_session(new_tokens, "--new-tokens"), "seed": seed},
        "budget": {"max_prefill_tokens_per_tick": max_prefill_tokens_per_tick},
    })
    cfg = config_mod.load(config, overrides)
    if verbose:
        import os  # noqa: PLC0415

        os.environ["MESHBENCH_VERBOSE"] = "1"
    if out_dir is not None:
        bundle.check_destination(out_dir, force)
    setup = run.prepare(cfg)
    total = sum(cfg.workload.new_tokens)
    with Progress(TextColumn("[bold]level {task.fields[level]:>3}"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("tokens"), TimeElapsedColumn(), console=err, transient=False) as progress:
        tasks: dict[int, int] = {}

        def on_tick(level: int, rec) -> None:
            if level not in tasks:
                tasks[level] = progress.add_task("", total=total, level=level)
            progress.advance(tasks[level], rec.decode_tokens + len(rec.prefill_sessions))

        data = run.run_sweep(cfg, _command(), on_tick, setup)
    if out_dir is not None:
        written = bundle.write(out_dir, data, force)
        err.print(f"wrote {out_dir}: {', '.join(written)}")
    if as_json:
        sys.stdout.write(json.dumps(data, indent=1) + "\n")
        return
    _print_sweep(data)


def _print_sweep(data: dict) -> None:
    from meshbench import report  # noqa: PLC0415

    t = Table(title=f"{data['story']}: {data['engine']['kind']} engine, {data['workload']['sessions']} sessions")
    for h in ("level", "ticks", "avg occ", "max occ", "tok/tick", "peak KV B", "tok/s", "ITL p50 ms"):
        t.add_column(h, justify="right")
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
    from meshbench import admission, config as config_mod  # noqa: PLC0415

    overrides = _drop_none({
        "engine": _engine_overrides(engine, preset, model, None, None, seed),
        "workload": {"sessions": sessions, "prompt_tokens": per_session(prompt_tokens, "--prompt-tokens"),
                     "new_tokens": per_session(new_tokens, "--new-tokens"), "seed": seed},
        "budget": {"kv_bytes": kv_bytes, "scratch_bytes": scratch_bytes, "weight_bytes": weight_bytes,
                   "max_active_sessions": max_active, "max_queue_depth": max_queue_depth,
                   "max_batch_size": max_batch_size},
    })
    cfg = config_mod.load(config, overrides)
    report_ = admission.run(cfg, burst)
    if as_json:
        sys.stdout.write(json.dumps(report_, indent=1) + "\n")
        return
    t = Table(title=f"admission on a node with {report_['effective_active_cap']} active slots, "
                    f"queue depth {cfg.budget['max_queue_depth']}")
    for h in ("session", "decision", "KV needed", "KV budget", "scratch needed", "scratch budget", "active",
              "queued"):
        t.add_column(h, justify="right")
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


bench_app = typer.Typer(help="Benchmarks: commands that print figures.", no_args_is_help=True)
app.add_typer(bench_app, name="bench")


@bench_app.command("engine")
def bench_engine(
    preset: Annotated[str, typer.Option("--preset", help="Synthetic model preset.")] = "bench",
    batches: Annotated[str, typer.Option("--batches", help="Batch sizes, e.g. 1,2,4,8,16.")] = "1,2,4,8,16",
    context: Annotated[int, typer.Option("--context", min=1, help="Cached positions per session.")] = 64,
    repeats: Annotated[int, typer.Option("--repeats", min=1, help="Timed decode steps per batch size.")] = 10,
    seed: SeedOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Time batched decode of the numpy engine against a loop of single-session decodes and this machine's floor."""
    from meshbench.bench import engine_bench  # noqa: PLC0415

    res = engine_bench.run(preset, int_list(batches, "--batches", unique=True), context, repeats, seed or 0,
                           progress=lambda msg: err.print(msg))
    if as_json:
        sys.stdout.write(json.dumps(res, indent=1) + "\n")
        return
    t = Table(title=f"engine benchmark: preset {preset}, {res['threads']} BLAS threads; bandwidth "
                    f"{res['bandwidth_gb_s']:.1f} GB/s, peak {res['peak_gflop_s']:.1f} GFLOP/s")
    for h in ("batch", "step ms", "tokens/s", "loop step ms", "loop tokens/s", "floor ms", "step/floor",
              "vs batch 1"):
        t.add_column(h, justify="right")
    for b in res["batches"]:
        t.add_row(str(b["batch"]), f"{b['step_ms']:.2f}", f"{b['tokens_per_s']:.1f}", f"{b['loop_step_ms']:.2f}",
                  f"{b['loop_tokens_per_s']:.1f}", f"{b['floor_ms']:.2f}", f"{b['step_over_floor']:.2f}",
                  f"{b['speedup_vs_batch1']:.2f}x")
    out.print(t)


@bench_app.command("layouts")
def bench_layouts(
    batches: Annotated[str, typer.Option("--batches", help="Activation rows, e.g. 1,2,4,8,16.")] = "1,2,4,8,16",
    as_json: JsonOpt = False,
) -> None:
    """Time matmul layouts for a large float32 weight times a few rows (the choice behind linear())."""
    from meshbench.bench import layouts  # noqa: PLC0415

    res = layouts.run(int_list(batches, "--batches", unique=True))
    if as_json:
        sys.stdout.write(json.dumps(res, indent=1) + "\n")
        return
    names = list(res["batches"][0]["ms"])
    t = Table(title=f"{res['weights']} float32 weights of {res['shape'][0]} x {res['shape'][1]} "
                    f"({res['bytes'] / 1e6:.0f} MB): ms per pass, best of 5")
    t.add_column("rows", justify="right")
    for n in names:
        t.add_column(n, justify="right")
    for b in res["batches"]:
        t.add_row(str(b["batch"]), *[f"{b['ms'][n]:.2f}" for n in names])
    out.print(t)


@bench_app.command("gguf")
def bench_gguf(
    model: Annotated[Path, typer.Option("--model", help="A GGUF file (e.g. make-tiny --preset bench --type q8_0).")],
    batches: Annotated[str, typer.Option("--batches", help="Batch sizes, e.g. 1,2,4,8.")] = "1,2,4,8",
    prompt_tokens: Annotated[int, typer.Option("--prompt-tokens", min=1)] = 16,
    steps: Annotated[int, typer.Option("--steps", min=2, help="Timed decode steps per batch size.")] = 32,
    threads: ThreadsOpt = None,
    seed: SeedOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Decode tokens/s of the GGUF engine driven by the scheduler vs a raw llama_decode loop."""
    from meshbench.bench import gguf_bench  # noqa: PLC0415
    from meshbench.engine.factory import check_model_path  # noqa: PLC0415

    res = gguf_bench.run(check_model_path(str(model)), int_list(batches, "--batches", unique=True), prompt_tokens, steps,
                         threads, seed or 0, progress=lambda msg: err.print(msg))
    if as_json:
        sys.stdout.write(json.dumps(res, indent=1) + "\n")
        return
    t = Table(title=f"GGUF engine through the scheduler vs raw llama_decode: {model}")
    for h in ("batch", "scheduler tok/s", "raw tok/s", "ratio", "raw step ms"):
        t.add_column(h, justify="right")
    for b in res["batches"]:
        t.add_row(str(b["batch"]), f"{b['scheduler_tokens_per_s']:.1f}", f"{b['raw_tokens_per_s']:.1f}",
                  f"{b['ratio']:.3f}", f"{b['raw_step_ms']:.2f}")
    out.print(t)


@bench_app.command("invariance")
def bench_invariance(
    model: Annotated[Path, typer.Option("--model", help="A GGUF file.")],
    steps: Annotated[int, typer.Option("--steps", min=1, help="Decode steps compared.")] = 16,
    threads: ThreadsOpt = None,
    seed: SeedOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Compare llama.cpp's logits at batch 8 and batch 1, per context configuration."""
    from meshbench.bench import invariance  # noqa: PLC0415
    from meshbench.engine.factory import check_model_path  # noqa: PLC0415

    res = invariance.run(check_model_path(str(model)), steps, threads, seed or 0, progress=lambda m: err.print(m))
    if as_json:
        sys.stdout.write(json.dumps(res, indent=1) + "\n")
        return
    t = Table(title=f"batch 8 vs batch 1 logits: {model} ({res['steps']} steps, prompts up to 600 tokens)")
    for h in ("config", "tokens identical", "logits bitwise identical", "max |logit diff|"):
        t.add_column(h, justify="right")
    for r in res["configs"]:
        t.add_row(r["config"], str(r["tokens_identical"]), str(r["bitwise_identical"]),
                  f"{r['max_abs_logit_diff']:.3g}")
    out.print(t)


model_app = typer.Typer(help="Model files: make the tiny GGUF models tests and evidence use.", no_args_is_help=True)
app.add_typer(model_app, name="model")


@model_app.command("make-tiny")
def make_tiny(
    out_path: Annotated[Path, typer.Argument(help="The .gguf file to write.")],
    preset: Annotated[str, typer.Option("--preset", help="dgr-012 | bench")] = "dgr-012",
    qtype: Annotated[str, typer.Option("--type", help="f32 | f16 | q8_0 | q4_0")] = "f32",
    seed: Annotated[int, typer.Option("--seed", min=0, help="Weight seed (the synthetic engine's).")] = 0,
    force: Annotated[bool, typer.Option("--force", help="Overwrite an existing file.")] = False,
) -> None:
    """Write a llama-architecture GGUF holding exactly the synthetic engine's deterministic weights."""
    from meshbench import gguf_io  # noqa: PLC0415
    from meshbench.model.config import preset as get_preset  # noqa: PLC0415
    from meshbench.model.weights import init_weights  # noqa: PLC0415

    cfg = get_preset(preset)
    if qtype not in gguf_io.TYPES:
        raise MeshbenchError(f"--type must be one of {', '.join(gguf_io.TYPES)}, got {qtype!r}")
    if out_path.is_dir():
        raise MeshbenchError(f"{out_path}: is a directory, expected a file path")
    if out_path.exists() and not force:
        raise MeshbenchError(f"{out_path}: exists; pass --force to overwrite it")
    if not out_path.parent.is_dir():
        raise MeshbenchError(f"{out_path}: directory {out_path.parent} does not exist")
    size = gguf_io.write(out_path, cfg, init_weights(cfg, seed), qtype)
    err.print(f"wrote {out_path}: preset {preset}, {qtype}, seed {seed}, {cfg.n_params} parameters, {size} bytes")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
