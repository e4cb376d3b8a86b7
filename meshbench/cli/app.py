"""The meshbench command line: the app and its commands, one module each (sweep, admit, verify, compare, bench,
node, model); the shared options in ``common``. Rich output and exit codes live in cli/ and nowhere else.

Exit codes: meshbench.cli.exits (printed by --help).
"""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from meshbench import __version__
from meshbench.cli import (
    admit,
    bench_clock,  # noqa: F401 - registers bench clock
    bench_gauges,  # noqa: F401 - registers bench gauges
    bench_llama,  # noqa: F401 - registers bench server, breakdown, invariance
    exits,
    hunt,
    sweep,
    verify,
)
from meshbench.cli import compare as cli_compare
from meshbench.cli.bench import bench_app, model_app
from meshbench.cli.common import out
from meshbench.cli.group import MeshbenchGroup
from meshbench.cli.node import node_app

app = typer.Typer(
    cls=MeshbenchGroup,
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Reproducible evidence for how an LLM inference node schedules concurrent sessions.",
    epilog=exits.epilog(),
)


def _version(value: bool) -> None:
    if value:
        out.print(f"meshbench {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        Optional[bool], typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")
    ] = None,
) -> None:
    pass


app.command()(sweep.sweep)
app.command()(admit.admit)
app.command()(verify.verify)
app.command("compare")(cli_compare.compare)
app.command()(hunt.hunt)
app.add_typer(bench_app, name="bench")
app.add_typer(node_app, name="node")
app.add_typer(model_app, name="model")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
