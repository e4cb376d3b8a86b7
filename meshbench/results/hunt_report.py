"""A hunt bundle read back (its results.json typed, every run judged again) and rendered: its README, findings
first, then what was covered and how, and the lines ``meshbench hunt`` prints."""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from pathlib import Path

from meshbench import validation
from meshbench.analysis import hunt as judge
from meshbench.analysis.hunt import CONFIDENT, Checked, shown
from meshbench.errors import MeshbenchError
from meshbench.names import README, RESULTS
from meshbench.records import history as hist
from meshbench.records import serial
from meshbench.records.history import Facts
from meshbench.records.hunt import HuntDocument, HuntServer, Run
from meshbench.results import kinds, markdown

KIND = kinds.HUNT
SCHEMA = "hunt.schema.json"
# A minimal history's confident differences said in words, at most (a shrink leaves few; the rest are counted: each
# is said by searching every other request's prompt, so a forged history of thousands would take hours to render)
SAID = 8


@dataclass(frozen=True, slots=True)
class Found:
    found: Checked
    confirmations: list[Checked]
    minimal: Checked
    minimal_confirmations: list[Checked]
    seconds_to_find: float


@dataclass(frozen=True, slots=True)
class HuntView:
    doc: HuntDocument
    checked: list[Checked]
    findings: list[Found]

    @property
    def facts(self) -> Facts:
        return self.doc.facts

    @property
    def limit(self) -> float:
        """The near-tie threshold every run is judged at: the one recorded."""
        return self.doc.near_tie

    def runs(self) -> list[tuple[str, Checked]]:
        """Every run judged, named where it is in the bundle (as ``HuntDocument.runs`` names them)."""
        judged = [*self.checked]
        for f in self.findings:
            judged += [*f.confirmations, f.minimal, *f.minimal_confirmations]
        return [(at, x) for (at, _), x in zip(self.doc.runs(), judged)]


def load(data: object, where: str) -> HuntDocument:
    """A hunt's results.json, held to its schema and typed (its histories checked by it), or one line naming what
    is wrong."""
    errors = validation.errors(data, SCHEMA)
    if errors:
        raise MeshbenchError(f"{where}: not a hunt bundle of this meshbench: {errors[0]}")
    return serial.hunt_document(data, where)


def run_of(run: Run, limit: float) -> Checked:
    """A recorded run, its answers and cold answers keyed by request, judged at ``limit``."""
    reqs = run.history.requests()
    by_name = dict(zip([r.name for r in reqs], run.answers))
    return judge.checked(run.history, by_name, dict(zip([r.name for r in run.judged()], run.cold)), limit)


def view(doc: HuntDocument) -> HuntView:
    """The document judged at its recorded near-tie threshold."""
    limit = doc.near_tie
    checked = [run_of(c, limit) for c in doc.checked]
    stray = next((k for k, x in enumerate(doc.findings) if not 0 <= x.checked < len(checked)), None)
    if stray is not None:
        raise MeshbenchError(f"findings[{stray}].checked: no history {doc.findings[stray].checked} was checked")
    found = [
        Found(
            found=checked[x.checked],
            confirmations=[run_of(c, limit) for c in x.confirmations],
            minimal=run_of(x.minimal, limit),
            minimal_confirmations=[run_of(c, limit) for c in x.minimal_confirmations],
            seconds_to_find=x.seconds_to_find,
        )
        for x in doc.findings
    ]
    return HuntView(doc, checked, found)


def reproduced(f: Found) -> bool:
    """A confident difference shown again in a run of its history or of its minimal one: a finding."""
    return bool(shown(f.confirmations) or shown(f.minimal_confirmations))


def lines(v: HuntView) -> list[str]:
    """The hunt in words, findings first (what ``meshbench hunt`` prints, and the README's opening)."""
    out = []
    for k, f in enumerate(v.findings, 1):
        steps, reqs, ids = f.minimal.history.size()
        what = "finding" if reproduced(f) else "not a finding, a difference seen once:"
        out.append(
            f"{what} {k} ({f.found.history.strategy}, after {f.seconds_to_find:.0f} s): shown in "
            f"{shown(f.confirmations)} of {len(f.confirmations)} runs again; minimal history {steps} steps, {reqs} "
            f"requests, {ids} prompt ids, shown in {shown(f.minimal_confirmations)} of "
            f"{len(f.minimal_confirmations)} runs on {v.doc.replays_on}"
        )
        confident = [j for j in f.minimal.judged if j.outcome == CONFIDENT]
        out += ["  " + judge.said(f.minimal, j) for j in confident[:SAID]]
        if len(confident) > SAID:
            out.append(f"  and {len(confident) - SAID} more confident differences in the minimal history")
    if not any(reproduced(f) for f in v.findings):
        out.append("nothing confident found that showed again")
    o = judge.outcomes(v.checked)
    out.append(f"{len(v.checked)} histories, {sum(o.values())} answers in {v.doc.seconds:.0f} s: "
               + ", ".join(f"{n} {k}" for k, n in o.items()))  # fmt: skip
    for name, s in judge.coverage(v.checked, len(v.facts.head)).items():
        out.append(f"  {name}: {s.histories} histories, {s.requests} requests, {s.cache_hits} served partly from the "
                   f"prompt cache beyond its first id ({s.ids_reused} ids reused)")  # fmt: skip
    out.append(f"a near-tie is a cold margin of at most {v.limit:.3g}; cold answers: {v.doc.cold_answers}")
    return out


def readme(doc: HuntDocument, name: str) -> str:
    """The bundle's README: findings first, then what was covered, then how to read and replay it."""
    v = view(doc)
    s = doc.server
    flags = markdown.inline(" ".join(s.args) or "none")
    how = f"started by meshbench with flags {flags}" if s.launched else "a running server"
    where = shlex.join(s.args) if s.node else "--target URL"
    head = [
        f"# {markdown.inline(name)}: a hunt for cross-request bugs",
        "",
        f"`meshbench hunt` against {served(s)}, model {markdown.inline(str(s.model))}, {how}), seed {doc.seed}, "
        f"strategies {', '.join(markdown.inline(x) for x in doc.strategies)}. Command: {markdown.code(doc.command)}.",
        "",
        "## Findings",
        "",
        *[
            f"- {markdown.inline(x)}" if not x.startswith("  ") else f"  - {markdown.inline(x.strip())}"
            for x in lines(v)
        ],
        "",
        "## How it was judged",
        "",
        f"Every answer is held to its cold answer: {markdown.inline(doc.cold_answers)}. Where it first differs, "
        "a cold margin within the server's numerics (measured before the hunt from requests sent cold twice and warm, "
        "between the floor and the cap) with the answer taking the cold answer's second choice is a near-tie; a "
        "change to a third choice there is unknown; anything above it is confident, a finding, confirmed by running "
        "its history again, then shrunk while it reproduces. The minimal histories are the `finding-K.json` files "
        f"beside this README: {markdown.code(f'meshbench hunt {where} --replay finding-1.json')}.",
        "",
        "Everything here is computed from `results.json` by `meshbench verify`; a rerun needs the server.",
        "",
    ]
    return "\n".join(head)


def bundle_files(doc: HuntDocument, name: str) -> dict[str, str]:
    """Every file of the bundle, by name, as ``doc`` renders it: results.json, then ``rendered_files``."""
    return {RESULTS: json.dumps(serial.to_json(doc), indent=1) + "\n", **rendered_files(doc, name)}


def rendered_files(doc: HuntDocument, name: str) -> dict[str, str]:
    """The files rendered from results.json: the README and each finding's minimal history (``finding-K.json``,
    replayable); what verify compares."""
    out = {README: readme(doc, name)}
    for k, f in enumerate(doc.findings, 1):
        out[f"finding-{k}.json"] = json.dumps(hist.to_json(f.minimal.history), indent=1) + "\n"
    return out


def served(s: HuntServer) -> str:
    """What the hunt ran against, opening a parenthesis its caller closes: "llama-server (b9581-..." or "meshbench's
    node (synthetic engine, ..."."""
    what = "meshbench's node" if s.node else "llama-server"
    return f"{what} ({markdown.inline(str(s.build_info))}"


def index_row(folder: Path, doc: HuntDocument) -> str:
    """The hunt's row of evidence/INDEX.md: what it found (judged again here), against which server and model."""
    v = view(doc)
    s = doc.server
    model = Path(s.model or "-").name
    o = judge.outcomes(v.checked)
    found = (
        "; ".join(
            f"finding {k}: {f.found.history.strategy}, minimal {f.minimal.history.size()[1]} requests, shown in "
            f"{shown(f.minimal_confirmations)} of {len(f.minimal_confirmations)}"
            for k, f in enumerate(v.findings, 1)
            if reproduced(f)
        )
        or f"nothing confident that showed again in {sum(o.values())} answers"
    )
    blas = doc.environment.compute.blas
    cpu = doc.environment.cpu + (f" ({blas.kernel})" if blas is not None and blas.kernel else "")
    made = markdown.code(doc.command.split(" --out")[0]).replace("|", "\\|")
    return (
        f"| [{folder.name}]({folder.name}/README.md) | a hunt for cross-request bugs: {markdown.inline(found)} | "
        f"{served(s)}), {markdown.inline(model)} | "
        f"hunt: {len(v.checked)} histories, seed {doc.seed} | n/a | n/a | not a sweep | {markdown.inline(cpu)} | "
        f"{v.limit:.3g} (near-tie threshold) | {made} |"
    )
