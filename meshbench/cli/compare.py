"""`meshbench compare`: the CI gate and the release gate, on the terminal, as JSON or as Markdown."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape

from meshbench import files
from meshbench.cli.common import JsonOpt, out, print_json, table
from meshbench.cli.options import flag
from meshbench.compare import diff as compare_mod
from meshbench.compare import report as compare_report
from meshbench.compare.model import Comparison
from meshbench.errors import MeshbenchError
from meshbench.results import bundle

COLORS = {"same": "green", "unchanged": "green", "improved": "cyan", "changed": "red", "regressed": "red"}


TOLERANCE = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*%?\s*")


def _tolerance(value: str) -> float:
    """A percentage: ``10%`` or a bare ``10`` (percent too), from 0% to 1000%; returned as a fraction."""
    m = TOLERANCE.fullmatch(value)
    if not m:
        raise MeshbenchError(f"--tolerance: {value!r} is not a percentage such as 10% (or 10)")
    t = float(m.group(1)) / 100
    if not 0 <= t <= 10:
        raise MeshbenchError(f"--tolerance: {value!r} must be between 0% and 1000%")
    return t


def compare(
    baseline: Annotated[Path, typer.Argument(help="The bundle to compare against.")],
    candidate: Annotated[Path, typer.Argument(help="The new bundle.")],
    tolerance: Annotated[
        str,
        typer.Option(
            "--tolerance",
            help="Smallest relative change of a median that counts, e.g. 10%. The default is above "
            "the drift measured between back-to-back sweeps on a shared 2-core machine.",
        ),
    ] = "10%",
    perf: Annotated[
        str,
        typer.Option(
            "--perf", help="A strong performance regression: fail (exit 1), warn (print it, exit 0) or ignore."
        ),
    ] = "fail",
    markdown: Annotated[
        Optional[Path],
        typer.Option("--markdown", help="Also write a Markdown summary here (a new file, never inside a bundle)."),
    ] = None,
    force: Annotated[bool, flag("--force", help="Let --markdown replace an existing file.")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Compare two bundles: outputs, scheduler figures and performance, level by level.

    Exit 0 same or improved, 1 outputs or scheduler changed or (--perf fail) performance regressed,
    2 unusable input.
    """
    if perf not in ("fail", "warn", "ignore"):
        raise MeshbenchError(f"--perf must be fail, warn or ignore, got {perf!r}")
    if markdown is not None:
        _check_markdown(markdown, force)
    report = compare_mod.compare(baseline, candidate, _tolerance(tolerance))
    if markdown is not None:
        _write_markdown(markdown, compare_report.render(report, perf))
    if as_json:
        print_json(report.to_json())
    else:
        _print(report, perf)
    raise typer.Exit(compare_mod.exit_code(report, perf))


def _check_markdown(path: Path, force: bool) -> None:
    """A summary never replaces a file unasked, and never goes into a bundle (it would break verify)."""
    try:
        files.replaceable_file(path, "--markdown")
        if path.exists() and not force:
            raise MeshbenchError(f"--markdown {path}: exists; pass --force to replace it")
        parent = path.absolute().parent
        if not parent.is_dir():
            raise MeshbenchError(f"--markdown {path}: {parent} is not a folder")
        if bundle.is_bundle(parent):
            raise MeshbenchError(f"--markdown {path}: {parent} is an evidence bundle; write the summary elsewhere")
    except OSError as e:
        raise MeshbenchError(f"--markdown {path}: {e.strerror or e}") from None


def _write_markdown(path: Path, text: str) -> None:
    try:
        files.write_atomically(path, text, ".meshbench-md-")
    except OSError as e:
        raise MeshbenchError(f"--markdown {path}: cannot write it ({e.strerror or e})") from None


def _colored(word: str, text: str | None = None) -> str:
    return f"[{COLORS.get(word, 'yellow')}]{text or word}[/]"


def _print(report: Comparison, perf: str) -> None:
    out.print(compare_report.sides_line(report), markup=False)
    for note in report.notes:
        out.print(f"note: {note}", markup=False)
    if report.differences:
        t = table(
            "what differs besides the workload" + (" (across machines)" if report.across_machines else ""),
            ("kind", "field", "baseline", "candidate"),
        )
        for d in report.differences:
            t.add_row(d.kind, d.field, str(d.baseline), str(d.candidate))
        out.print(t)
    t = table(f"{report.baseline} -> {report.candidate}: outputs and scheduler", ("level", "outputs", "scheduler"))
    for lv in report.levels:
        o, s = lv.outputs, lv.scheduler
        t.add_row(
            escape(compare_report.level_name(lv)),
            _colored(o.verdict, escape(compare_report.outputs_text(o))),
            _colored(s.verdict, compare_report.scheduler_text(s)),
        )
    out.print(t)
    t = table(
        f"performance, tolerance {report.tolerance:.0%} (--perf {perf}): median baseline -> candidate",
        ("level", "figure", "verdict", "baseline", "candidate", "change", "p"),
    )
    for lv in report.levels:
        for figure, v in lv.performance.items():
            t.add_row(
                escape(compare_report.level_name(lv)),
                figure,
                _colored(v.verdict, compare_report.verdict_text(v)),
                f"{v.baseline.median:.4g}",
                f"{v.candidate.median:.4g}",
                f"{v.change:+.1%}",
                "-" if v.p_value is None else f"{v.p_value:.3g}",
            )
    out.print(t)
    said = report.summary
    out.print(
        f"outputs_changed={said.outputs_changed} scheduler_changed={said.scheduler_changed} "
        f"regressed={said.regressed} improved={said.improved} weak={len(said.weak)}",
        markup=False,
    )
