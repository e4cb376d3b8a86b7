"""``meshbench sweep`` with a matrix of server settings (``engine.server_settings``): one endpoint sweep per
setting, each written as a bundle in a folder of --out, the matrix's README comparing them, then checked as
verify checks it. A sweep that fails keeps the settings finished before it, each a bundle of its own."""

from __future__ import annotations

import shlex
from pathlib import Path

import typer

from meshbench.cli.common import command_line, err, out, print_json, table
from meshbench.endpoint import matrix as run_matrix
from meshbench.errors import MeshbenchError
from meshbench.names import README, RESULTS
from meshbench.records import serial
from meshbench.results import bundle, document, envinfo, matrix_report
from meshbench.results import matrix as matrix_doc
from meshbench.verify import matrix as verify_matrix
from meshbench.workload import matrix
from meshbench.workload.config import RunConfig


def sweep(cfg: RunConfig, out_dir: Path | None, force: bool, as_json: bool) -> None:
    if out_dir is None:
        raise MeshbenchError("engine.server_settings: a matrix writes one bundle per setting into --out; give --out")
    bundle.prepare(out_dir, force)
    command = command_line()
    done: list[tuple[str, dict]] = []
    try:
        for finished in run_matrix.run(cfg, command, envinfo.environment(), _progress):
            done.append(finished)
    except (MeshbenchError, KeyboardInterrupt):
        _keep(out_dir, done)
        raise
    doc = matrix_doc.build(command, cfg, done)
    settings = [matrix_doc.setting(entry, data) for (_, data), entry in zip(done, doc.settings)]
    name = shlex.quote(bundle.display_name(out_dir))
    readme = matrix_report.render_readme(doc, settings, name)
    top = {
        RESULTS: document.dumps(serial.to_json(doc)),
        README: readme,
        bundle.COMMANDS: matrix_report.render_commands(doc, name),
    }
    bundle.commit_matrix(out_dir, top, [(s.folder, s.data) for s in settings], force)
    err.print(f"wrote {out_dir}: {len(settings)} settings' bundles, {', '.join(top)}", markup=False)
    if as_json:
        print_json(serial.to_json(doc))
    else:
        columns = [c.strip() for c in matrix_report.HEADER.strip("|").split("|")]
        t = table(f"{name}: {len(settings)} server settings, medians", tuple(columns))
        for row in matrix_report.table_rows(settings):
            t.add_row(*row)
        out.print(t)
    failures = verify_matrix.check(out_dir).failures
    if failures:
        for f in failures:
            err.print(f"sweep: {f}", markup=False)
        err.print(f"sweep: the evidence fails {len(failures)} checks that verify makes", markup=False)
        raise typer.Exit(1)


def _progress(message: str) -> None:
    err.print(f"sweep: {message}", markup=False)


def _keep(out_dir: Path, done: list[tuple[str, dict]]) -> None:
    """The settings swept before a failure, each written as a bundle of its own beside --out (OUT-FOLDER), where
    nothing is there yet: hours of sweeps are not lost to the one that failed."""
    for flags, data in done:
        path = out_dir.parent / f"{out_dir.name}-{matrix.folder(flags)}"
        try:
            bundle.write(path, data)
            err.print(f"sweep: kept setting {flags or '(none)'!r}, swept before the failure, in {path}", markup=False)
        except MeshbenchError as e:
            err.print(f"sweep: could not keep setting {flags or '(none)'!r}: {e}", markup=False)
