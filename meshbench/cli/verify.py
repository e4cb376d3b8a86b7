"""``meshbench verify``: check evidence bundles (the CI gate)."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Annotated

import typer

from meshbench.cli.common import (
    err,
    out,
)
from meshbench.endpoint import retokenize
from meshbench.errors import MeshbenchError
from meshbench.sweep import run
from meshbench.verify import bundle as verify_mod
from meshbench.verify import matrix as verify_matrix


def verify(
    bundles: Annotated[list[Path], typer.Argument(help="Evidence bundle folders (each holds results.json).")],
    rerun: Annotated[
        bool,
        typer.Option(
            "--rerun",
            help="Run the recorded configuration again and require every deterministic field to be identical.",
        ),
    ] = False,
    trust_endpoints: Annotated[
        bool,
        typer.Option(
            "--trust-endpoints",
            help="Let --rerun connect to the RPC endpoints a bundle names (engine.rpc); without "
            "it such a bundle is refused: a rerun would send the model to them.",
        ),
    ] = False,
) -> None:
    """Check evidence bundles: schema, recomputed figures and verdicts, the README, and (--rerun) reproduction.

    Exit 0 when every check holds, 1 when any fails, 2 when a bundle cannot be used.
    """
    worst = 0
    for path in bundles:  # every bundle is reported; the exit code is the worst status
        try:
            if verify_matrix.is_matrix(path):
                if rerun:
                    raise MeshbenchError(
                        f"{path}: a matrix of server settings (endpoint bundles): a rerun needs its server (verify it "
                        "without --rerun)"
                    )
                checks = verify_matrix.check(path, tokens=functools.partial(retokenize.here, bundle=path))
            else:
                checks = verify_mod.check_bundle(
                    path,
                    rerun=functools.partial(run.rerun_results, trust_endpoints=trust_endpoints, bundle=path)
                    if rerun
                    else None,
                    resolve=functools.partial(run.with_prompt_ids, bundle=path),
                    tokens=functools.partial(retokenize.here, bundle=path),
                )
        except MeshbenchError as e:
            err.print(f"error: {e}", markup=False)
            worst = max(worst, 2)
            continue
        for f in checks.failures:
            out.print(f"{path}/{f}", markup=False)
        status = "FAIL" if checks.failures else "ok"
        out.print(
            f"{path}: {status}: {checks.count} checks, {len(checks.failures)} failed"
            + (" (rerun included)" if rerun else "")
            + (
                f"; {checks.kernel_bound} records bound to other llama.cpp kernels NOT reproduced here"
                if checks.kernel_bound
                else ""
            ),
            markup=False,
        )
        for note in checks.notes:
            out.print(f"{path}: {note}", markup=False)
        if checks.failures:
            worst = max(worst, 1)
    raise typer.Exit(worst)
