"""verify for a hunt bundle: its results.json against its schema, then everything judged again from the records:
the near-tie threshold from the calibration passes, where cold answers and replays come from (as the server
recorded has them), every history drawn again from the seed by its strategies (each named once) for the recorded
facts (no history was picked by hand), every answer and cold answer its own request's and where that request is,
one cold answer for each distinct request across the bundle, the summary and its rate, the budget (spent, or the
hunt stopped at a finding shown again), each finding's time, confirmations and minimal history (one a shrink of the
history it came from could give, its runs of that history); then the README and the finding-K.json files as
results.json renders them (read as regular files only), and nothing else in the folder. The answers' own records
are meshbench.verify.hunt_records'; a node hunt's rerun (the CLI injects it: verify loads no engine) is
meshbench.hunt.rerun."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Callable

import numpy as np

from meshbench import files
from meshbench.analysis import endpoint_margins as margins
from meshbench.analysis import hunt as judge
from meshbench.analysis.checks import Checks
from meshbench.errors import MeshbenchError
from meshbench.names import README, RESULTS
from meshbench.records import history as hist
from meshbench.records.completion import Completion
from meshbench.records.hunt import HuntBudget, HuntDocument
from meshbench.records.margins import MarginPasses
from meshbench.results import document, hunt_report
from meshbench.verify import hunt_records
from meshbench.workload import hunt as strategies

SCHEMA = "hunt.schema.json"


def load(path: Path) -> HuntDocument:
    """The hunt's results.json, schema-valid and typed, or one line naming what is wrong."""
    rj = path / RESULTS
    return hunt_report.load(document.load(rj), str(rj))


def check(path: Path, rerun: Callable[[HuntDocument, Checks], None] | None = None) -> Checks:
    """Every check of the bundle; with ``rerun`` (the CLI's: a node hunt run again), its records compared with a
    rerun's as well, once they hold together."""
    doc = load(path)
    try:
        v = hunt_report.view(doc)
    except MeshbenchError as e:
        raise MeshbenchError(f"{path / RESULTS}: {e}") from None
    c = Checks()
    _threshold(c, doc)
    _server(c, doc)
    _histories(c, v)
    hunt_records.check(c, doc)
    hunt_records.calibration(c, doc)
    _command(c, doc)
    _answers(c, v)
    _summary(c, v)
    _budget(c, v)
    _findings(c, v)
    _files(c, path, doc)
    if rerun is not None and not c.failures:  # (a bundle that does not hold together is not run again)
        rerun(doc, c)
    return c


def _threshold(c: Checks, doc: HuntDocument) -> None:
    cal = doc.calibration
    passes = MarginPasses(cold=cal.cold, warm=cal.warm, together=cal.together)
    c.equal(RESULTS, "near_tie (recomputed from the calibration passes)", margins.near_tie(passes), doc.near_tie)


def _histories(c: Checks, v: hunt_report.HuntView) -> None:
    """Every history is the one its strategy draws from the seed for these facts, in turn."""
    names, seed = v.doc.strategies, v.doc.seed
    c.equal(RESULTS, "strategies (each one this meshbench knows)", True, all(n in strategies.STRATEGIES for n in names))
    c.equal(RESULTS, "strategies (each named once, as --strategies takes them)", len(names), len(set(names)))
    if not all(n in strategies.STRATEGIES for n in names) or not names:
        return
    for k, got in enumerate(v.checked):
        s = strategies.STRATEGIES[names[k % len(names)]]
        drawn = s.draw(np.random.default_rng([seed, k]), v.facts, [seed, k])
        c.equal(RESULTS, f"checked[{k}].history (drawn again from the seed by {s.name})", drawn, got.history)


def _answers(c: Checks, v: hunt_report.HuntView) -> None:
    """Every answer and cold answer has a margin and a second choice per token, and at most the ids asked."""
    for at, run in v.runs():
        for r in run.history.requests():
            if r.cancel_at is None and r.name in run.cold:
                x = run.cold[r.name]
                c.equal(RESULTS, f"{at}.cold.{r.name} (a margin and a second choice per token, at most the ids "
                        "asked)", True, x.error is not None or _fits(x, r.answer_tokens))  # fmt: skip
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


def _server(c: Checks, doc: HuntDocument) -> None:
    """Where cold answers come from and where findings run again, as the recorded server has them: the node's
    own words, a server meshbench started or one it was pointed at; the node, always started by meshbench from the
    config the command names; the slots the server said it has, those the histories were drawn for."""
    s = doc.server
    cold, replays = s.said()
    c.equal(RESULTS, "cold_answers (where the recorded server's cold answers come from)", cold, doc.cold_answers)
    c.equal(RESULTS, "replays_on (where the recorded server's findings run again)", replays, doc.replays_on)
    if s.node:
        c.equal(RESULTS, "server.launched (the node is always started by meshbench)", True, s.launched)
        config = _flag(doc, "--config")  # (as the CLI made it a path)
        named = ["--config", str(Path(config)) if config else None]
        c.equal(RESULTS, "server.args (the node's config, as the command names it)", named, s.args)
    c.equal(RESULTS, "facts.slots (the server's total_slots, 1 where it says none)", s.total_slots or 1,
            doc.facts.slots)  # fmt: skip
    c.equal(RESULTS, "facts.n_batch, n_ubatch (llama-server's defaults, which the hunt draws for)",
            [hist.N_BATCH, hist.N_UBATCH], [doc.facts.n_batch, doc.facts.n_ubatch])  # fmt: skip


def _int(value: str) -> int | str:
    """A whole number as the CLI reads one (``03``, ``+3``, ``3_0`` alike), else the word itself."""
    try:
        return int(value)
    except ValueError:
        return value


def _flag(doc: HuntDocument, flag: str) -> str | None:
    """The value the recorded command gives ``flag`` (its last, as the CLI reads it; None: not given)."""
    try:
        words = shlex.split(doc.command)
    except ValueError:
        return None
    found = None
    for k, w in enumerate(words):
        if w == flag and k + 1 < len(words):
            found = words[k + 1]
        elif w.startswith(flag + "="):
            found = w[len(flag) + 1 :]
    return found


def _command(c: Checks, doc: HuntDocument) -> None:
    """The command recorded ran this hunt: its seed, strategies and budget, each as the CLI reads it, or its
    default where it names none (the seed 0; every strategy, as this meshbench or an earlier one had them: new ones
    are added at the end; 10 minutes). A hunt now writes the seed and the strategies into its command."""
    seed, named, given = _flag(doc, "--seed"), _flag(doc, "--strategies"), _flag(doc, "--budget")
    c.equal(RESULTS, "command (its --seed, the seed recorded)", doc.seed, _int(seed) if seed is not None else 0)
    every = list(strategies.STRATEGIES)
    try:  # (all, or none named: every strategy this meshbench or an earlier one had, new ones added at the end)
        if named is None or named.strip() == "all":
            wanted = every[: len(doc.strategies)]
        else:
            wanted = [x.name for x in strategies.chosen(named)]
        seconds, requests = strategies.budget(given if given is not None else strategies.DEFAULT_BUDGET)
    except MeshbenchError as e:
        c.equal(RESULTS, "command (its --strategies and --budget, as the CLI reads them)", "read", str(e))
        return
    c.equal(RESULTS, "command (its --strategies, the strategies recorded)", wanted, doc.strategies)
    c.equal(RESULTS, "budget (the command's --budget: a time or a number of requests)",
            HuntBudget(seconds=seconds, requests=requests), doc.budget)  # fmt: skip


def _summary(c: Checks, v: hunt_report.HuntView) -> None:
    s = v.doc.summary
    c.equal(RESULTS, "summary.histories", len(v.checked), s.histories)
    c.equal(RESULTS, "summary.requests", sum(len(x.history.requests()) for x in v.checked), s.requests)
    c.equal(RESULTS, "summary.outcomes (judged again)", judge.outcomes(v.checked), s.outcomes)
    c.equal(RESULTS, "summary.coverage", judge.coverage(v.checked, len(v.facts.head)), s.coverage)
    lo, hi = _per_minute(len(v.checked), v.doc.seconds)
    c.equal(RESULTS, f"summary.histories_per_minute (from histories and seconds: {lo:.2f} to {hi:.2f})", True,
            lo <= s.histories_per_minute <= hi)  # fmt: skip


def _per_minute(n: int, seconds: float) -> tuple[float, float]:
    """The rate ``n`` histories in ``seconds`` (recorded to 0.1 s) rounds to at 0.01, lowest and highest."""
    if n == 0:
        return 0.0, 0.0
    lo_s, hi_s = max(seconds - 0.05, 1e-9), seconds + 0.05
    return n * 60 / hi_s - 0.005, n * 60 / lo_s + 0.005


def _budget(c: Checks, v: hunt_report.HuntView) -> None:
    """A history is drawn only while the budget lasts, and the hunt stops at a finding shown again or once the
    budget is spent: a bundle that stops short of both, or ran past its budget, is not what ran. Times are held to
    the least the records themselves took (their stamps): a finding no sooner than the histories before it."""
    doc = v.doc
    b, sent = doc.budget, [len(x.history.requests()) for x in v.checked]
    if b.requests is not None:
        c.equal(RESULTS, f"checked (each drawn with fewer than budget.requests = {b.requests} requests sent)",
                True, sum(sent[:-1]) < b.requests)  # fmt: skip
    stopped = bool(v.findings) and hunt_report.reproduced(v.findings[-1])
    spent = (b.requests is not None and sum(sent) >= b.requests) or (
        b.seconds is not None and doc.seconds + 0.05 >= b.seconds
    )
    c.equal(RESULTS, "budget (a time or a number of requests, as --budget gives it)", 1,
            sum(x is not None for x in (b.seconds, b.requests)))  # fmt: skip
    c.equal(RESULTS, "the hunt's end (at a finding shown again, or its budget spent)", True, stopped or spent)
    times = [f.seconds_to_find for f in v.findings]
    c.equal(RESULTS, "findings[].seconds_to_find (in the order found, none after the hunt's seconds)", True,
            times == sorted(times) and all(t <= doc.seconds for t in times))  # fmt: skip
    took = [x.least_seconds() for x in doc.checked]
    settled = {f.checked: sum(x.least_seconds() for x in f.settling()) for f in doc.findings}
    for k, f in enumerate(doc.findings):
        least = sum(took[: f.checked + 1]) + sum(t for j, t in settled.items() if j < f.checked)
        c.equal(RESULTS, f"findings[{k}].seconds_to_find (at least the {least:.1f} s its records before it took)",
                True, f.seconds_to_find + 0.05 >= least)  # fmt: skip
    least = sum(took) + sum(settled.values())
    c.equal(RESULTS, f"seconds (at least the {least:.1f} s the records took)", True, doc.seconds + 0.05 >= least)
    if b.seconds is not None and took:
        before = sum(took[:-1]) + sum(t for j, t in settled.items() if j < len(took) - 1)
        c.equal(RESULTS, f"checked (the last drawn within budget.seconds = {b.seconds:g}: {before:.1f} s of records "
                "before it)", True, before < b.seconds + 0.05)  # fmt: skip


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
        c.equal(RESULTS, f"{at}.minimal.history (one a shrink of its history could give)", None,
                hist.unshrinkable(f.minimal.history, f.found.history, len(v.facts.head)))  # fmt: skip


def _files(c: Checks, path: Path, doc: HuntDocument) -> None:
    expected = hunt_report.rendered_files(doc, written_as(path))  # (results.json's records were checked, as read)
    for name, text in expected.items():
        try:  # (a megabyte past the size it should have, at most: a file far larger is not read whole)
            found = files.read_text(path / name, name, len(text.encode()) + (1 << 20))
        except MeshbenchError as e:
            c.equal(name, "(a regular UTF-8 file, as results.json renders it)", "readable", str(e))
            continue
        line, want, got = _first_difference(text, found)
        c.equal(name, f"line {line} (as results.json renders it)", want, got)
    others = sorted(p.name for p in path.iterdir() if p.name not in {RESULTS, *expected})
    c.equal(RESULTS, "the folder (results.json, README.md and the findings' histories only)", [], others)


def written_as(path: Path) -> str:
    """The name the bundle was written under, as its README's title says it (the folder's own name where the
    title says none): a name is presentation, so a copy elsewhere, or renamed, reads the same; the title is then
    rendered again from it, so a name that is not the title's fails there."""
    try:
        title = files.read_text(path / README, README, 1 << 20).split("\n", 1)[0]
    except MeshbenchError:
        return path.name
    m = re.fullmatch(r"# (.+): a hunt for cross-request bugs", title)
    return re.sub(r"\\(.)", r"\1", m.group(1)) if m else path.name


def _first_difference(text: str, found: str) -> tuple[int, str, str]:
    """Where a rendered file and the file found first differ: the line's number, the line expected and the line
    found (the same line twice where they do not differ)."""
    want, got = text.split("\n"), found.split("\n")
    for k in range(max(len(want), len(got))):
        a = want[k] if k < len(want) else "(the file ends)"
        b = got[k] if k < len(got) else "(the file ends)"
        if a != b:
            return k + 1, a, b
    return 1, want[0], got[0]
