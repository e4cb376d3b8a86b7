"""Evidence bundles: a folder with results.json, README.md, commands.txt and a chart.

A bundle is built in a temporary folder beside its destination and renamed into place,
so an interruption or a crash never leaves a partial bundle, and an existing bundle is
replaced only with ``force``.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from meshbench import report, results
from meshbench.errors import MeshbenchError

RESULTS = "results.json"
README = "README.md"
COMMANDS = "commands.txt"
CHART = "chart.png"


def check_destination(out: Path, force: bool) -> None:
    """Refuse a destination we must not write, before any work is done."""
    if out.exists() and not out.is_dir():
        raise MeshbenchError(f"--out {out}: exists and is not a directory")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise MeshbenchError(f"--out {out}: a bundle already exists there; pass --force to replace it")
    parent = out.resolve().parent
    if not parent.is_dir():
        raise MeshbenchError(f"--out {out}: parent directory {parent} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise MeshbenchError(f"--out {out}: directory {parent} is not writable")


def write(out: Path, data: dict, force: bool = False) -> list[str]:
    """Validate ``data`` and write the bundle; returns the file names written."""
    errors = results.schema_errors(data)
    if errors:
        raise MeshbenchError(f"results.json would not validate: {errors[0]}")
    check_destination(out, force)
    parent = out.resolve().parent
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=parent))
    try:
        name = out.name if str(out) == out.name else str(out)
        (tmp / RESULTS).write_text(results.dumps(data))
        (tmp / README).write_text(report.render_readme(data, name))
        (tmp / COMMANDS).write_text(report.render_commands(data, name))
        written = [RESULTS, README, COMMANDS]
        if write_chart(data, tmp / CHART):
            written.append(CHART)
        _swap_in(tmp, out)
        return written
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _swap_in(tmp: Path, out: Path) -> None:
    if out.exists():
        old = out.with_name(f".{out.name}.old-{os.getpid()}")
        os.replace(out, old)
        try:
            os.replace(tmp, out)
        except BaseException:
            os.replace(old, out)  # put the previous bundle back: never lose data
            raise
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, out)


def write_chart(data: dict, path: Path) -> bool:
    """Occupancy and tokens per tick against concurrency; False when matplotlib is absent."""
    try:
        import matplotlib  # noqa: PLC0415 - optional extra

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415
    except ImportError:
        return False
    levels = data["levels"]
    c = [lv["concurrency"] for lv in levels]
    fig, ax = plt.subplots(1, 2, figsize=(9, 3.5))
    ax[0].plot(c, [lv["avg_batch_occupancy"] for lv in levels], "o-", label="average")
    ax[0].plot(c, [lv["max_batch_occupancy"] for lv in levels], "s--", label="max")
    ax[0].set_title("decode batch occupancy")
    ax[0].legend()
    ax[1].plot(c, [lv["tokens_per_tick"] for lv in levels], "o-")
    ax[1].set_title("tokens per tick")
    for a in ax:
        a.set_xlabel("concurrency")
        a.set_xscale("log", base=2)
        a.set_xticks(c, [str(x) for x in c])
        a.grid(alpha=0.3)
    fig.suptitle(f"{data['story']}: {data['engine']['kind']} engine, saturation at {data['saturation_concurrency']}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True
