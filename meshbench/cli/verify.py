"""``meshbench verify``: check evidence bundles (the CI gate)."""

from __future__ import annotations

import contextlib
import functools
import time
from pathlib import Path
from typing import Annotated, Callable, Optional

import typer

from meshbench.analysis.checks import Checks, printable
from meshbench.cli import exits, progress
from meshbench.cli.common import err, out, print_json
from meshbench.cli.options import flag
from meshbench.endpoint import retokenize
from meshbench.errors import MeshbenchError
from meshbench.records.hunt import HuntDocument
from meshbench.results import kinds
from meshbench.sweep import run
from meshbench.verify import bundle as verify_mod
from meshbench.verify import hunt as verify_hunt
from meshbench.verify import matrix as verify_matrix
from meshbench.verify import pins


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
    threads: Annotated[
        Optional[int],
        flag(
            "--threads",
            min=1,
            max=512,
            help="With --rerun: run the engine on this many CPU threads instead of the recorded count. Every record "
            "must still reproduce (llama.cpp's CPU kernels give each output to one thread); CI runs two reruns at "
            "once, one thread each.",
        ),
    ] = None,
    accept_other_kernels: Annotated[
        bool,
        typer.Option(
            "--accept-other-kernels",
            help="With --rerun: exit 0, not 4, when the only records that did not reproduce are bound to other "
            "llama.cpp kernels than the recording ones (tokens, and what follows from them). They are still "
            "counted and named; nothing here confirms them.",
        ),
    ] = False,
    as_json: Annotated[
        bool,
        flag(
            "--json",
            help="Print one JSON document on stdout (per bundle: status, checks, failures, notes, seconds) instead "
            "of lines; the exit code is the same.",
        ),
    ] = False,
    older: Annotated[
        Optional[Path],
        typer.Option(
            "--older",
            help="A JSON file pinning, by sha256, endpoint bundles of the older schema (3) to read under their own "
            "rules (evidence/OLDER.json); any other schema-3 bundle is refused.",
        ),
    ] = None,
) -> None:
    """Check evidence bundles: schema, recomputed figures and verdicts, the README, and (--rerun) reproduction.

    Exit 0 when every check holds, 1 when any fails, 2 when a bundle cannot be used, 4 when a rerun on other
    llama.cpp kernels could not reproduce records bound to the recording ones (unless --accept-other-kernels);
    a rerun's progress goes to stderr.
    """
    if threads is not None and not rerun:
        raise MeshbenchError("--threads chooses the threads of a rerun: give --rerun as well")
    if accept_other_kernels and not rerun:
        raise MeshbenchError("--accept-other-kernels accepts what a rerun could not reproduce: give --rerun as well")
    kinds.PINNED.clear()  # (only what this command's --older pins: never what an earlier one in this process did)
    if older is not None:
        kinds.PINNED.update(pins.read(older))
    worst = 0
    reports = []
    for path in bundles:  # every bundle is reported; the exit code is the worst status
        started = time.monotonic()
        try:
            checks = _checked(path, rerun, trust_endpoints, threads)
        except MeshbenchError as e:
            if not as_json:
                err.print(f"error: {printable(e)}", markup=False)
            reports.append({"bundle": str(path), "status": "error", "error": str(e)})
            worst = _worse(worst, exits.BAD_INPUT)
            continue
        seconds = time.monotonic() - started
        status = _status(checks, accept_other_kernels)
        reports.append(_report(path, checks, status, rerun, seconds))
        if not as_json:
            _print(path, checks, status, rerun)
        worst = _worse(worst, _EXIT[status])
    if as_json:
        print_json({"exit_code": worst, "rerun": rerun, "bundles": reports})
    raise typer.Exit(worst)


def _checked(path: Path, rerun: bool, trust_endpoints: bool, threads: int | None) -> Checks:
    return VERIFIERS[kinds.of_folder(path)](path, rerun, trust_endpoints, threads)


def _hunt(path: Path, rerun: bool, trust_endpoints: bool, threads: int | None) -> Checks:
    if threads is not None:
        raise MeshbenchError(f"{path}: a hunt: its rerun runs the threads its node config names (drop --threads)")
    if not rerun:
        return verify_hunt.check(path)
    from meshbench.hunt import rerun as hunt_rerun  # noqa: PLC0415 - a rerun loads an engine; a check does not

    def again(doc: HuntDocument, c: Checks) -> None:
        try:
            hunt_rerun.rerun(doc, c, lambda m: err.print(f"verify {printable(path)}: rerun: {m}", markup=False))
        except MeshbenchError as e:
            raise MeshbenchError(f"{path}: {e}") from None

    return verify_hunt.check(path, again)


def _matrix(path: Path, rerun: bool, trust_endpoints: bool, threads: int | None) -> Checks:
    if rerun:
        raise MeshbenchError(
            f"{path}: a matrix of server settings (endpoint bundles): a rerun needs its server (verify it "
            "without --rerun)"
        )
    return verify_matrix.check(path, tokens=functools.partial(retokenize.here, bundle=path))


def _sweep(path: Path, rerun: bool, trust_endpoints: bool, threads: int | None) -> Checks:
    with contextlib.ExitStack() as stack:
        rerunner = None
        if rerun:
            on_tick, on_pass = stack.enter_context(progress.passes(f"verify {printable(path)}: rerun"))
            rerunner = functools.partial(
                run.rerun_results,
                trust_endpoints=trust_endpoints,
                bundle=path,
                on_tick=on_tick,
                on_pass=on_pass,
                threads=threads,
            )
        return verify_mod.check_bundle(
            path,
            rerun=rerunner,
            resolve=functools.partial(run.with_prompt_ids, bundle=path),
            tokens=functools.partial(retokenize.here, bundle=path),
            threads=threads if rerun else None,
        )


# Each kind of bundle folder's verify (results.kinds.FOLDERS): (folder, --rerun, --trust-endpoints, --threads)
VERIFIERS: dict[str, Callable[[Path, bool, bool, int | None], Checks]] = {
    kinds.NODE: _sweep,
    kinds.ENDPOINT: _sweep,
    kinds.MATRIX: _matrix,
    kinds.HUNT: _hunt,
}


# A bundle's status, and the exit code it gives: a failing check outranks what other kernels left unconfirmed.
_EXIT = {"ok": exits.OK, "FAIL": exits.CHECK_FAILED, "NOT REPRODUCED": exits.NOT_REPRODUCED}


# The exit code of several bundles: the worst, where a bundle that could not be used outranks a failed check, and
# both outrank records not reproduced here (a gate that tolerates 4 must never pass a failure so).
_RANK = {exits.OK: 0, exits.NOT_REPRODUCED: 1, exits.CHECK_FAILED: 2, exits.BAD_INPUT: 3}


def _worse(a: int, b: int) -> int:
    return a if _RANK[a] >= _RANK[b] else b


def _status(checks: Checks, accept_other_kernels: bool) -> str:
    if checks.failures:
        return "FAIL"
    return "NOT REPRODUCED" if checks.kernel_bound and not accept_other_kernels else "ok"


def _print(path: Path, checks: Checks, status: str, rerun: bool) -> None:
    shown = printable(path)  # (a folder's name is the user's: never a line of its own, nor a colour)
    for f in checks.failures:
        out.print(f"{shown}/{f}", markup=False)
    unconfirmed = ""
    if checks.kernel_bound:
        unconfirmed = (
            f"; {checks.kernel_bound} records bound to other llama.cpp kernels NOT reproduced here, so not "
            "confirmed" + {"ok": " (accepted: --accept-other-kernels)", "NOT REPRODUCED": " (exit 4)"}.get(status, "")
        )
    out.print(
        f"{shown}: {status}: {checks.count} checks, {len(checks.failures)} failed"
        + (" (rerun included)" if rerun else "")
        + unconfirmed,
        markup=False,
    )
    for note in checks.notes:
        out.print(f"{shown}: {note}", markup=False)


def _report(path: Path, checks: Checks, status: str, rerun: bool, seconds: float) -> dict:
    """One bundle's outcome as --json gives it."""
    return {
        "bundle": str(path),
        "status": status,
        "checks": checks.count,
        "failed": len(checks.failures),
        "failures": [
            {"file": f.file, "field": f.field, "expected": str(f.expected), "found": str(f.found)}
            for f in checks.failures
        ],
        "kernel_bound": checks.kernel_bound,
        "notes": list(checks.notes),
        "rerun": rerun,
        "seconds": round(seconds, 3),
    }
