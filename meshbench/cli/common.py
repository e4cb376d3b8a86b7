"""What every meshbench command shares: the consoles, flag parsing and option types."""

from __future__ import annotations

import io
import json
import os
import shlex
import sys

from rich.console import Console
from rich.table import Table

from meshbench.cli.options import OPTIONS, float_list, int_list, per_session  # noqa: F401 - shared


def _width(stream) -> int | None:
    # Piped output keeps full-width tables instead of rich's 80-column fallback; a closed
    # stream (None) is reported when something is written to it, not at import.
    return None if stream is not None and stream.isatty() else 160


out = Console(highlight=False, soft_wrap=True, width=_width(sys.stdout))
err = Console(stderr=True, highlight=False, soft_wrap=True, width=_width(sys.stderr))


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


# The options commands share, as parameter types: each declared once, in meshbench.cli.options.
ConfigOpt = OPTIONS["config"].annotated
EngineOpt = OPTIONS["engine"].annotated
TargetOpt = OPTIONS["target"].annotated
ServeOpt = OPTIONS["serve"].annotated
ServerArgsOpt = OPTIONS["server_args"].annotated
ApiOpt = OPTIONS["api"].annotated
PresetOpt = OPTIONS["preset"].annotated
ModelOpt = OPTIONS["model"].annotated
DeviceOpt = OPTIONS["device"].annotated
ThreadsOpt = OPTIONS["threads"].annotated
SessionsOpt = OPTIONS["sessions"].annotated
PromptOpt = OPTIONS["prompt_tokens"].annotated
NewOpt = OPTIONS["new_tokens"].annotated
SeedOpt = OPTIONS["seed"].annotated
JsonOpt = OPTIONS["as_json"].annotated
PromptsOpt = OPTIONS["prompts"].annotated
RatesOpt = OPTIONS["rates"].annotated
QueueOpt = OPTIONS["max_queue_depth"].annotated
SloTtftOpt = OPTIONS["slo_ttft"].annotated
SloTpotOpt = OPTIONS["slo_tpot"].annotated
ClockOpt = OPTIONS["clock"].annotated
RepeatOpt = OPTIONS["repeat"].annotated
WarmupOpt = OPTIONS["warmup"].annotated
RpcOpt = OPTIONS["rpc"].annotated
WorkersOpt = OPTIONS["workers"].annotated
SplitOpt = OPTIONS["split"].annotated
PrefillOpt = OPTIONS["prefill"].annotated
MixedOpt = OPTIONS["mixed_batch"].annotated
RepackOpt = OPTIONS["repack"].annotated
FlashAttnOpt = OPTIONS["flash_attn"].annotated
TiledOpt = OPTIONS["tiled_mm"].annotated
EosOpt = OPTIONS["eos"].annotated
IsolationOpt = OPTIONS["isolation"].annotated
AllowRemoteOpt = OPTIONS["allow_remote"].annotated
IsolationRoundsOpt = OPTIONS["isolation_rounds"].annotated
IsolateOpt = OPTIONS["isolate"].annotated
InjectOpt = OPTIONS["inject"].annotated
RestartOpt = OPTIONS["restart_engine"].annotated
ArrivalsOpt = OPTIONS["arrivals"].annotated


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
