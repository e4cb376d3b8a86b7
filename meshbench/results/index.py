"""evidence/INDEX.md: one row per committed bundle, rendered from the bundles' own results.json.

``python -m meshbench.results.index evidence > evidence/INDEX.md``; tests/test_readme.py keeps it current.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from meshbench.analysis import figures
from meshbench.names import RESULTS
from meshbench.results import document, index_rows, kinds, matrix, matrix_report

HEADER = index_rows.HEADER


def _row(folder: Path) -> str:
    d = json.loads((folder / RESULTS).read_text())
    if matrix.is_matrix(d):
        d = matrix.load(folder)  # (its folders checked: each its flags' own, inside the bundle)
        return matrix_report.index_row(folder, d, matrix.settings(folder, d, lambda p: document.load(p / RESULTS)))
    return kinds.index_row(folder, d)


def render(root: Path) -> str:
    bundles = sorted(p for p in root.iterdir() if (p / RESULTS).is_file())
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


if __name__ == "__main__":
    sys.stdout.write(render(Path(sys.argv[1] if len(sys.argv) > 1 else "evidence")))
