"""verify for a hunt bundle: its results.json against its schema, then everything judged again from the records:
the near-tie threshold from the calibration passes, every history drawn again from the seed by its strategy for
the recorded facts (no history was picked by hand), every answer and cold answer where its request is, one cold
answer for each distinct request across the bundle, the summary, each finding's confirmations and its minimal
history (no larger than the history it came from, its runs of that history); then the README and the
finding-K.json files as results.json renders them, and nothing else in the folder."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from meshbench import validation
from meshbench.analysis import endpoint_margins as margins
from meshbench.analysis import hunt as judge
from meshbench.analysis.checks import Checks
from meshbench.analysis.hunt import Checked
from meshbench.errors import MeshbenchError
from meshbench.names import README, RESULTS
from meshbench.records import serial
from meshbench.records.completion import Completion
from meshbench.records.history import NODE_COLD, NODE_REPLAYS
from meshbench.records.margins import MarginPasses
from meshbench.results import document, hunt_report
from meshbench.workload import hunt as strategies

SCHEMA = "hunt.schema.json"


def is_hunt(path: Path) -> bool:
    """Does the folder hold a hunt's results.json? Read as verify reads any (a regular file, strict JSON: never a
    FIFO waited on); anything else is left to verify's own loading, which says what is wrong with it."""
    try:
        return document.load(path / RESULTS).get("kind") == "hunt"
    except (MeshbenchError, OSError):
        return False


def load(path: Path) -> dict[str, Any]:
    """The hunt's results.json, schema-valid, or one line naming what is wrong."""
    rj = path / RESULTS
    data = document.load(rj)
    errors = validation.errors(data, SCHEMA)
    if errors:
        raise MeshbenchError(f"{rj}: not a hunt bundle of this meshbench: {errors[0]}")
    return data


def check(path: Path) -> Checks:
    doc = load(path)
    try:
        v = hunt_report.view(doc)
    except MeshbenchError as e:
        raise MeshbenchError(f"{path / RESULTS}: {e}") from None
    c = Checks()
    _threshold(c, doc)
    _server(c, doc)
    _histories(c, doc, v)
    _answers(c, v)
    _summary(c, doc, v)
    _findings(c, v)
    _files(c, path, doc)
    return c


def _threshold(c: Checks, doc: dict[str, Any]) -> None:
    cal = {k: [serial.completion(x) for x in doc["calibration"][k]] for k in ("cold", "together", "warm")}
    passes = MarginPasses(cold=cal["cold"], warm=cal["warm"], together=cal["together"])
    c.equal(RESULTS, "near_tie (recomputed from the calibration passes)", margins.near_tie(passes), doc["near_tie"])


def _histories(c: Checks, doc: dict[str, Any], v: hunt_report.HuntView) -> None:
    """Every history is the one its strategy draws from the seed for these facts, in turn."""
    names = doc["strategies"]
    c.equal(RESULTS, "strategies (each one this meshbench knows)", True, all(n in strategies.STRATEGIES for n in names))
    if not all(n in strategies.STRATEGIES for n in names) or not names:
        return
    for k, got in enumerate(v.checked):
        s = strategies.STRATEGIES[names[k % len(names)]]
        drawn = s.draw(np.random.default_rng([doc["seed"], k]), v.facts, [doc["seed"], k])
        c.equal(RESULTS, f"checked[{k}].history (drawn again from the seed by {s.name})", drawn, got.history)


def _answers(c: Checks, v: hunt_report.HuntView) -> None:
    """Every run answers each request once and gives each judged one a cold answer; one cold answer per distinct
    request across the bundle (the oracle asks once)."""
    seen: dict[tuple[object, ...], list[int]] = {}
    for at, run in _runs(v):
        for r in run.history.requests():
            if r.cancel_at is None and r.name in run.cold:
                x = run.cold[r.name]
                c.equal(RESULTS, f"{at}.cold.{r.name} (a margin and a second choice per token, at most the ids "
                        "asked)", True, x.error is not None or _fits(x, r.answer_tokens))  # fmt: skip
                earlier = seen.setdefault(r.key(), x.tokens)
                c.equal(RESULTS, f"{at}.cold.{r.name} (the cold answer of every alike request)", earlier, x.tokens)
            answer = run.answers.get(r.name)
            if answer is not None and answer.error is None and r.cancel_at is None:
                c.equal(RESULTS, f"{at}.answers.{r.name} (a margin and a second choice per token, at most the "
                        "ids asked)", True, _fits(answer, r.answer_tokens))  # fmt: skip


def _fits(x: Completion, n: int) -> bool:
    """At most ``n`` tokens, a margin for each where margins are given, and a second choice for each where those
    are, never the token itself."""
    seconds = x.runner_up
    return (
        len(x.tokens) <= n
        and (x.margins is None or len(x.margins) == len(x.tokens))
        and (seconds is None or (len(seconds) == len(x.tokens) and all(s != t for s, t in zip(seconds, x.tokens))))
    )


def _server(c: Checks, doc: dict[str, Any]) -> None:
    """What the server is agrees with how its cold answers and replays were had: the node's own words, or a
    server's."""
    node = doc["server"]["kind"] == "node"
    c.equal(RESULTS, "server.kind (the node's cold answers and replays, or a server's)", node,
            doc["cold_answers"] == NODE_COLD and doc["replays_on"] == NODE_REPLAYS)  # fmt: skip


def _runs(v: hunt_report.HuntView) -> list[tuple[str, Checked]]:
    out = [(f"checked[{k}]", x) for k, x in enumerate(v.checked)]
    for k, f in enumerate(v.findings):
        out += [(f"findings[{k}].confirmations[{j}]", x) for j, x in enumerate(f.confirmations)]
        out += [(f"findings[{k}].minimal", f.minimal)]
        out += [(f"findings[{k}].minimal_confirmations[{j}]", x) for j, x in enumerate(f.minimal_confirmations)]
    return out


def _summary(c: Checks, doc: dict[str, Any], v: hunt_report.HuntView) -> None:
    s = doc["summary"]
    c.equal(RESULTS, "summary.histories", len(v.checked), s["histories"])
    c.equal(RESULTS, "summary.requests", sum(len(x.history.requests()) for x in v.checked), s["requests"])
    c.equal(RESULTS, "summary.outcomes (judged again)", judge.outcomes(v.checked), s["outcomes"])
    c.equal(RESULTS, "summary.coverage", judge.coverage(v.checked, len(v.facts.head)), s["coverage"])


def _findings(c: Checks, v: hunt_report.HuntView) -> None:
    """Every history judged confident is settled: run again CONFIRM times, its minimal history no larger, run again
    as often; the hunt stops at the first shown again (a finding), and goes on past one shown in no run again."""
    c.equal(RESULTS, "findings (every history with a confident difference, in order)",
            [k for k, x in enumerate(v.checked) if judge.confident(x.judged)],
            [v.checked.index(f.found) for f in v.findings])  # fmt: skip
    c.equal(RESULTS, "findings (the hunt went on past those shown in no run again, and stopped at one shown again)",
            [False] * max(0, len(v.findings) - 1), [hunt_report.reproduced(f) for f in v.findings[:-1]])  # fmt: skip
    if v.findings and hunt_report.reproduced(v.findings[-1]):
        c.equal(RESULTS, "checked (none after the finding shown again)", len(v.checked) - 1,
                v.checked.index(v.findings[-1].found))  # fmt: skip
    for k, f in enumerate(v.findings):
        at = f"findings[{k}]"
        c.equal(RESULTS, f"{at}.confirmations (its history, {judge.CONFIRM} times)", [f.found.history] * judge.CONFIRM,
                [x.history for x in f.confirmations])  # fmt: skip
        c.equal(RESULTS, f"{at}.minimal_confirmations (the minimal history, {judge.CONFIRM} times)",
                [f.minimal.history] * judge.CONFIRM, [x.history for x in f.minimal_confirmations])  # fmt: skip
        c.equal(RESULTS, f"{at}.minimal (no larger than the history it was shrunk from)", True,
                all(a <= b for a, b in zip(f.minimal.history.size(), f.found.history.size())))  # fmt: skip


def _files(c: Checks, path: Path, doc: dict[str, Any]) -> None:
    expected = {README: hunt_report.readme(doc, path.name)}
    for k, f in enumerate(doc["findings"], 1):
        expected[f"finding-{k}.json"] = json.dumps(f["minimal"]["history"], indent=1) + "\n"
    for name, text in expected.items():
        try:
            found = (path / name).read_text()
        except (OSError, UnicodeDecodeError):
            found = None
        c.equal(name, "(as results.json renders it)", text, found)
    others = sorted(p.name for p in path.iterdir() if p.name not in {RESULTS, *expected})
    c.equal(RESULTS, "the folder (results.json, README.md and the findings' histories only)", [], others)
