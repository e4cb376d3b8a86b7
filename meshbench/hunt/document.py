"""A hunt as its bundle's results.json: the server, the seed and strategies, the facts the histories were drawn
for, the calibration passes the near-tie threshold is measured from, every history with every answer and cold
answer, and each finding with its confirmations, its minimal history and that one's confirmations. Nothing judged
is stored but the summary: verify and the README judge again from the records."""

from __future__ import annotations

from meshbench import __version__
from meshbench.analysis import hunt as judge
from meshbench.analysis.hunt import Checked
from meshbench.hunt.run import Finding, Hunt
from meshbench.records.hunt import (
    Calibration,
    FindingRecord,
    HuntBudget,
    HuntDocument,
    HuntServer,
    HuntSummary,
    Run,
)
from meshbench.results import hunt_report
from meshbench.results.document import created_at
from meshbench.results.envinfo import environment

KIND, VERSION = hunt_report.KIND, 1


def document(h: Hunt, server: HuntServer, command: str, budget: HuntBudget) -> HuntDocument:
    minutes = max(h.seconds, 1e-9) / 60
    return HuntDocument(
        kind=KIND,
        schema_version=VERSION,
        meshbench_version=__version__,
        created_at=created_at(),
        command=command,
        environment=environment(),
        server=server,
        seed=h.seed,
        strategies=h.strategies,
        budget=budget,
        facts=h.facts,
        calibration=Calibration(
            cold=list(h.calibration.cold), together=list(h.calibration.together), warm=list(h.calibration.warm)
        ),
        near_tie=h.threshold,
        cold_answers=h.how_cold,
        replays_on=h.replays_on,
        seconds=round(h.seconds, 1),
        checked=[run(c) for c in h.checked],
        findings=[_finding(h, f) for f in h.findings],
        summary=HuntSummary(
            histories=len(h.checked),
            requests=sum(len(c.history.requests()) for c in h.checked),
            histories_per_minute=round(len(h.checked) / minutes, 2),
            outcomes=judge.outcomes(h.checked),
            coverage=judge.coverage(h.checked, len(h.facts.head)),
        ),
    )


def run(c: Checked) -> Run:
    """A history as it ran: its requests, then each one's answer and each judged one's cold answer, in order."""
    reqs = c.history.requests()
    answers = [c.answers[r.name] for r in reqs]
    return Run(history=c.history, answers=answers, cold=[c.cold[r.name] for r in reqs if r.name in c.cold])


def _finding(h: Hunt, f: Finding) -> FindingRecord:
    return FindingRecord(
        checked=next(k for k, c in enumerate(h.checked) if c is f.found),
        seconds_to_find=round(f.seconds_to_find, 1),
        shrink_tries=f.shrink_tries,
        confirmations=[run(c) for c in f.confirmations],
        minimal=run(f.minimal if f.minimal is not None else f.found),
        minimal_confirmations=[run(c) for c in f.minimal_confirmations],
    )
