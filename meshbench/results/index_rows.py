"""A bundle's row of evidence/INDEX.md, for each kind (``meshbench.results.kinds`` registers them)."""

from __future__ import annotations

from pathlib import Path

from meshbench.analysis import figures
from meshbench.records import serial
from meshbench.results import markdown

HEADER = (
    "| bundle | title | engine, model | levels | corruption_free | batch_invariant | isolation proven at | "
    "recorded on | smallest margin | made by |\n|---|---|---|---|---|---|---|---|---|---|"
)


def node_row(folder: Path, d: dict) -> str:
    """A node's sweep: its verdicts, the isolation bound, the machine, the smallest margin."""
    e = d["engine"]
    model = e.get("model_name") or e.get("preset") or Path(e.get("model") or "").name or "-"
    iso = d["isolation"]
    made = d["command"].split(" --out")[0]
    bits = [lv["isolation_verdict"]["escape_bits"] for lv in d["levels"] if lv["isolation_verdict"]["ran"]]
    bound = f", escape <= 2^-{min(bits)}" if bits and None not in bits else ""
    low = figures.smallest_margin(serial.levels_of(d))
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


def endpoint_row(folder: Path, d: dict) -> str:
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
