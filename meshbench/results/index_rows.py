"""A bundle's row of evidence/INDEX.md, for each kind (``meshbench.results.kinds`` registers them)."""

from __future__ import annotations

from pathlib import Path

from meshbench.analysis import figures
from meshbench.records.context import Environment, GgufEngineInfo
from meshbench.results import markdown
from meshbench.results.typed import EndpointBundle, NodeBundle

HEADER = (
    "| bundle | title | engine, model | levels | corruption_free | batch_invariant | isolation proven at | "
    "recorded on | smallest margin | made by |\n|---|---|---|---|---|---|---|---|---|---|"
)


def node_row(folder: Path, b: NodeBundle) -> str:
    """A node's sweep: its verdicts, the isolation bound, the machine, the smallest margin."""
    r = b.results
    e = r.engine
    name = e.model_name if isinstance(e, GgufEngineInfo) else None
    model = name or e.preset or Path(e.model or "").name or "-"
    made = r.command.split(" --out")[0]
    bits = [lv.isolation_verdict.escape_bits for lv in b.levels if lv.isolation_verdict.ran]
    bound = f", escape <= 2^-{min(x for x in bits if x is not None)}" if bits and None not in bits else ""
    low = figures.smallest_margin(b.levels)
    tie = "-" if low is None else f"{low.margin:.3g}" + (" (near-tie)" if low.margin < figures.near_tie(e) else "")
    return (
        f"| [{folder.name}]({folder.name}/README.md) | {markdown.inline(r.title or '')} | {e.kind}, "
        f"{markdown.inline(model)} | "
        f"{','.join(str(lv.concurrency) for lv in b.levels[:8])}{' ...' if len(b.levels) > 8 else ''} | "
        f"{r.corruption_free} | {r.batch_invariant} | {r.isolation.levels_run} of {len(b.levels)} levels{bound} | "
        f"{cpu(r.environment)} | {tie} | {_cell_code(made)} |"
    )


def _cell_code(text: str) -> str:
    """A command as a code span in a table cell: a pipe escaped even there (GitHub's tables split on it)."""
    return markdown.code(text).replace("|", "\\|")


def cpu(env: Environment) -> str:
    kernel = env.compute.blas.kernel if env.compute.blas else None
    return markdown.inline(env.cpu + (f" ({kernel})" if kernel else ""))


def endpoint_row(folder: Path, b: EndpointBundle) -> str:
    """A served model: corruption is not provable over HTTP (n/a); batch invariance is the served outputs'."""
    r = b.results
    e = r.endpoint
    model = e.launched.model if e.launched else ", ".join(map(str, e.models))
    made = r.command.split(" --out")[0]
    return (
        f"| [{folder.name}]({folder.name}/README.md) | {markdown.inline(r.title)} | endpoint "
        f"({markdown.inline(e.name)}), {markdown.inline(model)} | "
        f"{','.join(str(lv.concurrency) for lv in r.levels)}"
        + (f"; open loop {','.join(f'{x.rate:g}' for x in r.rates)}/s" if r.rates else "")
        + " | n/a (over HTTP) | "
        f"{r.verdicts.batch_invariant} | not provable over HTTP | {cpu(r.environment)} | - | {_cell_code(made)} |"
    )
