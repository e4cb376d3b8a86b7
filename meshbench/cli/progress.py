"""Progress on stderr for the commands that run passes (sweep, verify --rerun): a bar per level on a terminal,
one line per level elsewhere (a pipe, a CI log). It counts passes, each of its kind, so it never runs past its
total: the timed passes, the isolation passes (and their confirmations, added as they start) and the cache-off
pass are all planned before the level starts."""

from __future__ import annotations

import contextlib
import time
from typing import Callable, Iterator

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from meshbench.cli.common import err
from meshbench.sweep.levels import PassDone

Watch = Callable[[PassDone], None]


@contextlib.contextmanager
def passes(label: str) -> Iterator[Watch]:
    """A callback for a sweep's ``on_pass``: ``label`` names what runs (``sweep``, or a bundle's rerun)."""
    if not err.is_terminal:
        yield _lines(label)
        return
    with Progress(
        TextColumn(f"[bold]{label}" + " level {task.fields[level]:>3}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("passes ({task.fields[kinds]})"),
        TimeElapsedColumn(),
        console=err,
        transient=False,
    ) as bar:
        tasks: dict[int, TaskID] = {}
        counts: dict[int, dict[str, int]] = {}

        def on_pass(p: PassDone) -> None:
            kinds = counts.setdefault(p.level, {})
            kinds[p.kind] = kinds.get(p.kind, 0) + 1
            shown = ", ".join(f"{k} {n}" for k, n in kinds.items())
            if p.level not in tasks:
                tasks[p.level] = bar.add_task("", total=p.planned, level=p.level, kinds=shown)
            bar.update(tasks[p.level], total=p.planned, completed=p.done, kinds=shown)

        yield on_pass


def _lines(label: str) -> Watch:
    """One line as each level's first pass ends, and one when its last planned pass ends."""
    started = time.monotonic()

    def on_pass(p: PassDone) -> None:
        if p.done == 1:
            err.print(f"{label}: level {p.level}: pass 1 of {p.planned} done", markup=False)
        elif p.done == p.planned:
            took = time.monotonic() - started
            err.print(f"{label}: level {p.level}: {p.done} passes done ({took:.0f} s so far)", markup=False)

    return on_pass
