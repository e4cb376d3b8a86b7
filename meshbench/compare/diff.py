"""`meshbench compare BASELINE CANDIDATE`: two bundles of either kind, level by level, through one path.

Each bundle is verified, then reduced to its side (``meshbench.compare.sides``): a meshbench node against
another, a served endpoint against another, or one against the other ("llama-server vs meshbench's node, same
model, same prompts"). Per common level, three verdicts (``meshbench.compare.verdicts``): outputs, scheduler,
performance. Two llama.cpp builds (llama-cpp-python's and a server's) may compute differently: figures and
each side's own determinism compare across them; token identity holds only where both compute alike.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from meshbench.compare import sides, verdicts
from meshbench.compare.model import Comparison, Difference, LevelComparison, Verdicts
from meshbench.compare.sides import Side
from meshbench.errors import MeshbenchError
from meshbench.results import kinds
from meshbench.verify import bundle as verify

NOTE_QUEUE = (
    "TTFT and E2E are left out: the two sides submitted sessions differently ({}), and both figures count time "
    "queued; throughput, ITL and TPOT compare."
)
NOTE_VERSIONS = (
    "The two sides run different llama.cpp builds (or engines): their figures and each side's own determinism "
    "compare; token identity between them holds only where both compute alike."
)


def verified(path: Path, role: str) -> Side:
    """A bundle that passes verify, reduced to its side; or a MeshbenchError that says why not."""
    try:
        data, typed, checks = verify.checked_bundle(path)
    except MeshbenchError as e:
        raise MeshbenchError(f"{role}: {e}") from None
    if checks.failures:
        raise MeshbenchError(
            f"{role} {path} does not pass verify ({len(checks.failures)} failed checks, the first: "
            f"{checks.failures[0]}); run meshbench verify {path}"
        )
    return sides.side(kinds.of(data), typed)


def compare(baseline: Path, candidate: Path, tolerance: float) -> Comparison:
    b, c = verified(baseline, "baseline"), verified(candidate, "candidate")
    _same_workload(b, c, baseline, candidate)
    common = sorted(set(b.levels) & set(c.levels), key=lambda k: (k[2], k[1] or 0.0, k[0]))
    if not common:
        raise MeshbenchError(f"{baseline} and {candidate} share no level (concurrency and arrival rate)")
    names = verdicts.compared_figures(b, c)
    levels = [
        LevelComparison(
            concurrency=k[0],
            rate=k[1],
            faults=list(k[2]),
            outputs=verdicts.outputs(b, b.levels[k], c, c.levels[k]),
            scheduler=verdicts.scheduler(b, b.levels[k], c, c.levels[k]),
            performance=verdicts.performance(b.levels[k], c.levels[k], tolerance, names),
        )
        for k in common
    ]
    notes = [NOTE_QUEUE.format(f"{b.submission} against {c.submission}")] if b.submission != c.submission else []
    if b.version != c.version:
        notes.append(NOTE_VERSIONS)
    return Comparison(
        baseline=str(baseline),
        candidate=str(candidate),
        sides=[b.name, c.name],
        versions=[b.version, c.version],
        compared_by=b.by if b.by == c.by else None,
        tolerance=tolerance,
        differences=differences(b, c),
        across_machines=_machine(b) != _machine(c),
        notes=notes,
        levels=levels,
        summary=summarize(levels),
    )


def _same_workload(b: Side, c: Side, baseline: Path, candidate: Path) -> None:
    """The fields of the workload both sides record must match: else there is nothing to compare."""
    fields = sorted(
        (k for k in set(b.workload) & set(c.workload) if b.workload[k] != c.workload[k]),
        key=lambda k: (k != "sessions", k),
    )
    if fields:
        named = ", ".join(f"workload.{k}" for k in fields)
        was, now = b.workload[fields[0]], c.workload[fields[0]]
        first = f"{_short(was, now)} against {_short(now, was)}"
        raise MeshbenchError(
            f"{baseline} and {candidate} ran different workloads ({named} differ; {fields[0]}: {first}): "
            "there is nothing to compare"
        )


def _short(value: object, other: object = None) -> str:
    """A workload field in a message: a list of per-session lengths as its distinct values, with its length where
    that is what differs ("[8] against [8]" said nothing)."""
    if not isinstance(value, list):
        return repr(value)[:80]
    try:
        distinct = str(sorted(set(value)))[:80]
    except TypeError:  # (a list of lists: a conversation's turns)
        distinct = repr(value)[:80]
    return f"{len(value)} sessions, {distinct}" if isinstance(other, list) and len(other) != len(value) else distinct


def summarize(levels: list[LevelComparison]) -> Verdicts:
    perf = [(lv.name, f, v) for lv in levels for f, v in lv.performance.items()]
    return Verdicts(
        outputs_changed=[lv.name for lv in levels if lv.outputs.verdict == "changed"],
        scheduler_changed=[lv.name for lv in levels if lv.scheduler.verdict == "changed"],
        regressed=[f"{f}@{c}" for c, f, v in perf if v.verdict == "regressed" and v.strong],
        improved=[f"{f}@{c}" for c, f, v in perf if v.verdict == "improved" and v.strong],
        weak=[f"{f}@{c}" for c, f, v in perf if v.verdict != "unchanged" and not v.strong],
    )


def exit_code(report: Comparison, perf: str) -> int:
    """0 same or improved; 1 outputs or scheduler changed, or (``perf`` fail) a strong regression."""
    s = report.summary
    if s.outputs_changed or s.scheduler_changed:
        return 1
    return 1 if perf == "fail" and s.regressed else 0


def differences(b: Side, c: Side) -> list[Difference]:
    """Everything both sides say about themselves that differs, besides the workload, labelled by what it is."""
    return [
        Difference(kind=kind, field=field, baseline=b.facts[kind, field], candidate=c.facts[kind, field])
        for kind, field in b.facts
        if (kind, field) in c.facts and b.facts[kind, field] != c.facts[kind, field]
    ]


def _machine(side: Side) -> tuple[Any, ...]:
    return tuple(side.facts.get(("machine", k)) for k in sides.MACHINE_FIELDS)
