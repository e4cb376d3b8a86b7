"""A comparison's records: what ``meshbench compare`` finds level by level, and the whole report (written as
JSON by ``--json``, in field order, and rendered by ``meshbench.compare.report``)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from meshbench.records.model import Summary


@dataclass(frozen=True, slots=True, kw_only=True)
class FigureVerdict:
    """One figure at one level, judged over both sides' repetitions (``meshbench.analysis.stats.judge``)."""

    verdict: str  # improved, unchanged or regressed
    strong: bool  # both sides have >= 5 repetitions
    change: float  # candidate median / baseline median - 1
    p_value: float | None
    reason: str
    baseline: Summary
    candidate: Summary
    higher_is_better: bool
    ratio: float | None  # candidate / baseline median (None from a zero baseline)


@dataclass(frozen=True, slots=True, kw_only=True)
class Divergence:
    """Where the outputs first differ: a session's token (ids on both sides), or its length."""

    session_id: str
    token_index: int | None = None
    reference_token: int | None = None
    token: int | None = None
    reference_margin: float | None = None
    margin: float | None = None
    reference_tokens: int | None = None  # (equal where both have tokens: one side stopped earlier)
    tokens: int | None = None

    def describe(self) -> str:
        if self.token_index is None:
            return f"{self.session_id}: {self.reference_tokens} tokens -> {self.tokens}"
        return (
            f"{self.session_id} token {self.token_index}: {self.reference_token} -> {self.token} "
            f"(margin {_g(self.reference_margin)} -> {_g(self.margin)})"
        )


def _g(x: float | None) -> str:
    return "-" if x is None else f"{x:.3g}"


@dataclass(frozen=True, slots=True, kw_only=True)
class OutputsVerdict:
    verdict: str  # same, changed, or "not compared (why)"
    sessions_compared: int
    sessions_changed: list[str]
    first_divergence: Divergence | None


@dataclass(frozen=True, slots=True, kw_only=True)
class Change:
    baseline: Any
    candidate: Any


@dataclass(frozen=True, slots=True, kw_only=True)
class SchedulerVerdict:
    verdict: str  # same, changed, or "not compared (why)"
    changes: dict[str, Change]


@dataclass(frozen=True, slots=True, kw_only=True)
class LevelComparison:
    concurrency: int
    rate: float | None
    faults: list[str]
    outputs: OutputsVerdict
    scheduler: SchedulerVerdict
    performance: dict[str, FigureVerdict]

    @property
    def name(self) -> int | str:
        """A level in the summary: its concurrency, with its arrival rate or its fault row when it has one."""
        if self.faults:
            return f"{self.concurrency}[{','.join(self.faults)}]"
        return self.concurrency if self.rate is None else f"{self.concurrency}@{self.rate:g}"


@dataclass(frozen=True, slots=True, kw_only=True)
class Difference:
    """Something besides the workload that differs between the sides, labelled by what it is."""

    kind: str  # engine, server, budget, run, machine, software
    field: str
    baseline: Any
    candidate: Any


@dataclass(frozen=True, slots=True, kw_only=True)
class Verdicts:
    """The report's verdicts, by level and figure: what the exit code reads."""

    outputs_changed: list[int | str]  # levels by name (LevelComparison.name)
    scheduler_changed: list[int | str]
    regressed: list[str]
    improved: list[str]
    weak: list[str]


@dataclass(frozen=True, slots=True, kw_only=True)
class Comparison:
    baseline: str
    candidate: str
    sides: list[str]  # what each side is: a meshbench node (its engine), a served endpoint (its server)
    versions: list[str | None]
    compared_by: str | None  # token ids, text, or None (ids on one side, text on the other)
    tolerance: float
    differences: list[Difference]
    across_machines: bool
    notes: list[str]
    levels: list[LevelComparison]
    summary: Verdicts

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
