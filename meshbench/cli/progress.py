"""Progress on stderr for the commands that run passes (sweep, verify --rerun): a bar per level on a terminal,
one line per level elsewhere (a pipe, a CI log). It counts passes, each of its kind, so it never runs past its
total: the timed passes, the isolation passes and the cache-off pass are planned before the level starts, and a
confirmation (planned only once a session changed) grows the total as it ends, before it is counted."""

from __future__ import annotations

import contextlib
import time
from typing import Any, Callable, Iterator

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from meshbench.cli.common import err
from meshbench.sweep.levels import PassDone

Watch = Callable[[PassDone], None]
Ticks = Callable[[int, Any], None]


@contextlib.contextmanager
def passes(label: str) -> Iterator[tuple[Ticks, Watch]]:
    """Callbacks for a sweep's ``on_tick`` and ``on_pass``: ``label`` names what runs (``sweep``, or a bundle's
    rerun). Off a terminal a level's first tick says it started, so a log shows a long first pass is under way."""
    if not err.is_terminal:
        started: set[int] = set()

        def on_tick(level: int, rec: Any) -> None:  # noqa: ARG001
            if level not in started:
                started.add(level)
                err.print(f"{label}: level {level} started", markup=False)

        yield on_tick, _lines(label)
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

        yield (lambda level, rec: None), on_pass


def _lines(label: str) -> Watch:
    """A line as each level's first pass ends, as its last planned pass ends, and at most every EVERY_S between."""
    started = time.monotonic()
    last = [started]

    def on_pass(p: PassDone) -> None:
        now = time.monotonic()
        if p.done in (1, p.planned) or now - last[0] >= EVERY_S:
            last[0] = now
            err.print(
                f"{label}: level {p.level}: {p.done} of {p.planned} passes done ({p.kind}; {now - started:.0f} s)",
                markup=False,
            )

    return on_pass


EVERY_S = 15.0  # a long level still says it is alive in a CI log
