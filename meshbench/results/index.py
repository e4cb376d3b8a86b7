"""evidence/INDEX.md: one row per committed bundle, rendered from the bundles' own results.json.

``python -m meshbench.results.index evidence > evidence/INDEX.md``; tests/test_readme.py keeps it current.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from meshbench.analysis import figures
from meshbench.names import RESULTS
from meshbench.results import markdown

HEADER = (
    "| bundle | title | engine, model | levels | corruption_free | batch_invariant | isolation proven at | "
    "recorded on | smallest margin | made by |\n|---|---|---|---|---|---|---|---|---|---|"
)


def _row(folder: Path) -> str:
    d = json.loads((folder / RESULTS).read_text())
    if d.get("kind") == "endpoint":
        return _endpoint_row(folder, d)
    e = d["engine"]
    model = e.get("model_name") or e.get("preset") or Path(e.get("model") or "").name or "-"
    iso = d["isolation"]
    made = d["command"].split(" --out")[0]
    bits = [lv["isolation_verdict"]["escape_bits"] for lv in d["levels"] if lv["isolation_verdict"]["ran"]]
    bound = f", escape <= 2^-{min(bits)}" if bits and None not in bits else ""
    low = figures.smallest_margin(d["levels"])
    tie = (
        "-" if low is None else f"{low['margin']:.3g}" + (" (near-tie)" if low["margin"] < figures.near_tie(e) else "")
    )
    return (
        f"| [{folder.name}]({folder.name}/README.md) | {markdown.inline(d['title'])} | {e['kind']}, {model} | "
        f"{','.join(str(lv['concurrency']) for lv in d['levels'][:8])}{' ...' if len(d['levels']) > 8 else ''} | "
        f"{d['corruption_free']} | {d['batch_invariant']} | {iso['levels_run']} of {len(d['levels'])} levels{bound} | "
        f"{_cpu(d)} | {tie} | `{made}` |"
    )


def _cpu(d: dict) -> str:
    fp = d["environment"].get("compute")
    kernel = (fp or {}).get("blas") and fp["blas"].get("kernel")
    return markdown.inline(d["environment"]["cpu"] + (f" ({kernel})" if kernel else ""))


def _endpoint_row(folder: Path, d: dict) -> str:
    """A served model: corruption is not provable over HTTP (n/a); batch invariance is the served outputs'."""
    e = d["endpoint"]
    server = e.get("launched", {}).get("server") or e["server"]
    model = e.get("launched", {}).get("model") or ", ".join(map(str, e["models"]))
    made = d["command"].split(" --out")[0]
    return (
        f"| [{folder.name}]({folder.name}/README.md) | {markdown.inline(d['title'])} | endpoint ({server}), {model} | "
        f"{','.join(str(lv['concurrency']) for lv in d['levels'])} | n/a (over HTTP) | "
        f"{d['verdicts']['batch_invariant']} | not provable over HTTP | {_cpu(d)} | - | `{made}` |"
    )


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
