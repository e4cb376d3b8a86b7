"""evidence/INDEX.md: one row per committed bundle, rendered from the bundles' own results.json.

``python -m meshbench.results.index evidence > evidence/INDEX.md``, and README.md's evidence at a glance with
``--readme``; tests/test_readme.py keeps both current.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Callable

from meshbench.analysis import figures
from meshbench.errors import MeshbenchError
from meshbench.names import RESULTS
from meshbench.results import document, hunt_report, index_rows, kinds, matrix, matrix_report

HEADER = index_rows.HEADER


def _matrix_row(folder: Path, data: Any) -> str:
    d = matrix.load(folder)  # (its folders checked: each its flags' own, inside the bundle)
    return matrix_report.index_row(folder, d, matrix.settings(folder, d, lambda p: document.load(p / RESULTS)))


# Each kind of bundle's row (results.kinds.FOLDERS): (its folder, its results.json as read) -> the row
ROWS: dict[str, Callable[[Path, Any], str]] = {
    kinds.NODE: kinds.index_row,
    kinds.ENDPOINT: kinds.index_row,
    kinds.MATRIX: _matrix_row,
    kinds.HUNT: lambda folder, d: hunt_report.index_row(folder, hunt_report.load(d, str(folder / RESULTS))),
}


def _row(folder: Path) -> str:
    d = document.load(folder / RESULTS)  # (as verify reads one: a regular file, strict JSON)
    return ROWS[kinds.of(d)](folder, d)


def _bundles(root: Path) -> list[Path]:
    """Every folder with a results.json, whatever it is (one that is not a regular file is named, not left out)."""
    return sorted(p for p in root.iterdir() if (p / RESULTS).exists() or (p / RESULTS).is_symlink())


def readme_table(root: Path, link: str = "evidence") -> str:
    """README.md's evidence at a glance: the index's first three columns (bundle, title, engine and model), each
    bundle linked from the repository's top level."""
    rows = ["| bundle | what it shows | engine, model |", "|---|---|---|"]
    for b in _bundles(root):
        bundle, title, engine = _row(b).strip("| ").split(" | ")[:3]
        rows.append(f"| {bundle.replace('](', f']({link}/', 1)} | {title} | {engine} |")
    return "\n".join(rows) + "\n"


def render(root: Path) -> str:
    bundles = _bundles(root)
    return "\n".join(
        [
            "# Evidence bundles",
            "",
            "Each folder holds results.json, its README (rendered from it), commands.txt and a chart; "
            "`meshbench verify evidence/*/ --rerun` checks them all (CI does; an endpoint bundle, a served model "
            "measured over HTTP, is verified without --rerun: a rerun needs its server). A rerun on another CPU holds "
            "every token, schedule and verdict identical and the margins within a stated tolerance; a bundle whose "
            f"smallest margin is a near-tie (below {figures.NEAR_TIE} on llama.cpp, "
            f"{figures.NEAR_TIE_FLOAT64:g} on the float64 numpy engine) may not reproduce token for token on kernels "
            "that round differently ([determinism](../docs/concepts/determinism.md)).",
            "",
            HEADER,
            *[_row(b) for b in bundles],
            "",
        ]
    )


def main(args: list[str]) -> int:
    """Write the index (or with --readme, README.md's table) of the bundles in a folder; a bundle that cannot be
    read is one line naming it, and exit 2."""
    readme = "--readme" in args
    folder = Path(next((a for a in args if a != "--readme"), "evidence"))
    try:
        text = readme_table(folder) if readme else render(folder)
    except (MeshbenchError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
