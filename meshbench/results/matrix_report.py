"""A settings matrix's README, commands.txt and evidence-index row, rendered from its results.json and its
settings' bundles alone (verify renders them again and compares): one row per setting and level, each cell a
record of that setting's bundle, whose own README has the proofs in full."""

from __future__ import annotations

from pathlib import Path

from meshbench.names import RESULTS
from meshbench.records.margins import Divergences
from meshbench.records.matrix import MatrixDocument
from meshbench.records.model import EndpointLevel
from meshbench.results import markdown
from meshbench.results.endpoint_proofs_report import kinds
from meshbench.results.endpoint_report import cell
from meshbench.results.index_rows import cpu
from meshbench.results.matrix import Setting
from meshbench.results.typed import EndpointBundle

HEADER = (
    "| setting | C | differ from C=ref | differ from cold: near-tie / confident | depends on neighbours (p) | "
    "canary hits | warm differs from cold | cancel: new outputs | tok/s | TTFT p50 ms |"
)


def render_readme(doc: MatrixDocument, settings: list[Setting], name: str) -> str:
    first = settings[0].bundle.results
    e = first.endpoint
    # (every string a server or the matrix supplies is escaped, as in an endpoint bundle's README)
    server = markdown.inline(f"{e.name} (version {e.launched.version})" if e.launched else e.name)
    model = markdown.inline(e.launched.model if e.launched else ", ".join(map(str, e.models)))
    return "\n".join(
        [
            f"# {markdown.inline(doc.story)}: {markdown.inline(doc.title)}, a matrix of server settings",
            "",
            f"{server} on {model}, started by meshbench "
            "once per setting, each setting's flags added to "
            + (f"the matrix's own ({markdown.code(doc.server_args)})" if doc.server_args else "nothing else")
            + ", and swept alike: the same prompts, levels and "
            "proofs. Each setting's sweep is an endpoint bundle of its own in the folder named below, with its "
            "proofs in full in its README; `meshbench verify` checks "
            f"each of them, their digests recorded in `{RESULTS}`, and this README. Made by "
            f"{markdown.code(doc.command)}.",
            "",
            "```",
            f"meshbench verify {name}",
            "```",
            "",
            "## Per setting and level",
            "",
            "Differ from C=ref: sessions whose output differs from the reference level's. Differ from cold: answers "
            "of the level (timed repetitions and needle trials) that differ from their session's cold answer "
            "(alone, `cache_prompt` false), by the margin where they first differ: a near-tie is within the "
            "server's measured numerics, a confident one is a suspected leak. Depends on neighbours: the "
            "perturbation test's p-value, **bold** where it found a dependence. Canary hits: another session's "
            "code found in an answer (a proven leak). Warm differs from cold: sessions whose answer right after "
            "itself differs from its cold one (per setting). Cancel: answers with a new output after every second "
            "client disconnected and retried. tok/s and TTFT p50: medians over the repetitions, min..max.",
            "",
            HEADER,
            "|" + "---|" * 10,
            *("| " + " | ".join(row) + " |" for row in table_rows(settings)),
            "",
            "## Per setting",
            "",
            *(_verdict(s) for s in settings),
            "",
            "Everything here is computed from the settings' bundles by `meshbench verify`; a rerun needs the server.",
            "",
        ]
    )


def table_rows(settings: list[Setting]) -> list[list[str]]:
    """The table's rows, cell by cell: each setting's levels, the setting named on its first."""
    return [row for s in settings for row in _rows(s)]


def _rows(s: Setting) -> list[list[str]]:
    b = s.bundle
    v, d = b.results.verdicts, b.results.divergences
    warm = "-" if d is None else str(len(d.warm_differing))
    rows = []
    for k, lv in enumerate(b.results.levels):
        c = lv.concurrency
        cold = "-" if d is None or c not in d.levels else f"{d.levels[c].near_ties} / {d.levels[c].confident}"
        rows.append(
            [
                _setting(s) if k == 0 else "",
                str(c),
                str(len(v.differing_sessions[c])),
                cold,
                _depends(lv),
                _hits(b, lv.concurrency),
                warm if k == 0 else "",
                _cancel(lv),
                cell(lv.figures.tokens_per_s),
                cell(lv.figures.ttft_ms_p50),
            ]
        )
    return rows


def _setting(s: Setting) -> str:
    return f"[{markdown.inline(s.flags) if s.flags else 'the defaults'}]({s.folder}/README.md)"


def _depends(lv: EndpointLevel) -> str:
    p = lv.perturbation
    if p is None:
        return "-"
    v = p.verdict
    if v.failed or v.depends is None:
        return f"not judged ({v.p_value:.3g})"
    return f"**{v.p_value:.3g}**" if v.depends else f"{v.p_value:.3g}"


def _hits(b: EndpointBundle, c: int) -> str:
    found = b.results.canaries
    if found is None or not any(lv.concurrency == c and lv.canary is not None for lv in b.results.levels):
        return "-"
    n = sum(h.carrier_level == c for h in found.hits)
    return f"**{n}**" if n else ("0" if found.leak is not None else "0 (not judged)")


def _cancel(lv: EndpointLevel) -> str:
    run = lv.cancel
    if run is None:
        return "-"
    v = run.verdict
    new = [*v.others_differing, *v.retries_differing]
    if v.failed:
        return f"not judged ({v.failed} failed)"
    return kinds(new) if new else "0"


def _sibling(d: Divergences | None) -> str:
    """The answers right after a sibling that differ from cold ("" without a sibling pass)."""
    if d is None or d.sibling_differing is None:
        return ""
    found = d.sibling_differing
    return f"; right after a sibling, {len(found)} differ from cold" + (f" ({kinds(found)})" if found else "")


def _verdict(s: Setting) -> str:
    r = s.bundle.results
    v, found = r.verdicts, r.canaries
    depends = [str(lv.concurrency) for lv in r.levels if lv.perturbation and lv.perturbation.verdict.depends]
    d = r.divergences
    confident = [] if d is None else d.confident
    alone = sum(not x.beside for x in confident)
    threshold = (
        ""
        if d is None
        else (
            f" (placed by the draw: a boundary moved at most {d.threshold:.3g}, this setting's numerics)"
            if d.by_draw
            else f" (a near-tie: a margin of at most {d.threshold:.3g}, this setting's numerics)"
        )
    )
    leak = "not judged" if found is None or found.leak is None else ("**yes**" if found.leak else "no")
    launched = " ".join(r.endpoint.launched.args) if r.endpoint.launched else ""
    return (
        f"- [{s.folder}]({s.folder}/README.md), flags `{markdown.inline(launched)}`: batch_invariant "
        f"{v.batch_invariant}, run_to_run_deterministic {v.run_to_run_deterministic}; a canary crossed: {leak}; "
        f"output depends on the neighbours' content at C = {', '.join(depends) or 'none'}; confident "
        f"divergences from cold{threshold}: {len(confident)}"
        + (f", {alone} of them with no session beside (the server's own state, not a neighbour)" if alone else "")
        + _sibling(d)
        + f"; environment {cpu(r.environment)}."
    )


def render_commands(doc: MatrixDocument, name: str) -> str:
    return f"# made by\n{doc.command}\n# verify\nmeshbench verify {name}\n"


def index_row(folder: Path, doc: MatrixDocument, settings: list[Setting]) -> str:
    """The matrix's row of evidence/INDEX.md: per setting, its outputs' batch invariance."""
    r = settings[0].bundle.results
    e = r.endpoint
    model = e.launched.model if e.launched else ", ".join(map(str, e.models))
    invariant = ", ".join(f"{s.folder} {s.bundle.results.verdicts.batch_invariant}" for s in settings)
    return (
        f"| [{folder.name}]({folder.name}/README.md) | {markdown.inline(doc.title)} | endpoint ({e.name}), {model}, "
        f"{len(settings)} settings | {','.join(str(lv.concurrency) for lv in r.levels)} | n/a (over HTTP) | "
        f"{invariant} | not provable over HTTP | {cpu(r.environment)} | - | `{doc.command.split(' --out')[0]}` |"
    )
