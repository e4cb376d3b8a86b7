"""An endpoint sweep's figures as types: one pass's (``PassFigures``), and each over a level's or a rate's
repetitions (``LevelFigures``: its median, min and max). Each field declares its figure once: the name results.json
keys it by (``ttft_ms.p50``), its unit, and what it measures (meshbench.analysis.endpoint computes them from the
client's stamps alone; ``FIGURES`` lists them in order)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import Any


@dataclass(frozen=True, slots=True, kw_only=True)
class Figure:
    """A figure: its name in results.json, its unit, what it measures, and whether higher is better."""

    attr: str  # the records' field
    name: str
    unit: str
    meaning: str
    higher_is_better: bool


def figure(name: str, unit: str, meaning: str, higher_is_better: bool) -> Any:
    """A record field that is the figure ``name`` (its key in results.json)."""
    return field(metadata={"json": name, "figure": (unit, meaning, higher_is_better)})


def named(name: str) -> Any:
    """A record field keyed ``name`` in results.json."""
    return field(metadata={"json": name})


@dataclass(frozen=True, slots=True, kw_only=True)
class PassFigures:
    """One pass's figures, from its answers' stamps (a failed answer counted, never timed)."""

    tokens_per_s: float = figure("tokens_per_s", "tokens/s", "tokens received over the pass's wall time", True)
    total_tokens_per_s: float = figure(
        "total_tokens_per_s", "tokens/s", "prompt and received tokens over the pass's wall time", True
    )
    ttft_ms_p50: float | None = figure("ttft_ms.p50", "ms", "time to the first token from submission, p50", False)
    ttft_ms_p99: float | None = figure("ttft_ms.p99", "ms", "time to the first token from submission, p99", False)
    itl_ms_p50: float | None = figure("itl_ms.p50", "ms", "between a session's consecutive tokens (chunks), p50", False)
    itl_ms_p99: float | None = figure("itl_ms.p99", "ms", "between a session's consecutive tokens (chunks), p99", False)
    tpot_ms_p50: float | None = figure(
        "tpot_ms.p50", "ms", "(last - first token) / (tokens - 1), per session, p50", False
    )
    e2e_ms_p50: float | None = figure("e2e_ms.p50", "ms", "submission to the last token, p50", False)
    e2e_ms_p99: float | None = figure("e2e_ms.p99", "ms", "submission to the last token, p99", False)
    goodput_per_s: float = figure("goodput_per_s", "sessions/s", "sessions within every SLO, per second", True)
    completed: int = figure("completed", "sessions", "answers without an error", True)
    failed: int = figure("failed", "sessions", "answers with an error (HTTP, malformed, cut, the deadline)", False)
    early_stops: int = figure("early_stops", "sessions", "answers that ended before the tokens asked", False)


@dataclass(frozen=True, slots=True, kw_only=True)
class Spread:
    """A figure over the repetitions."""

    median: float
    min: float
    max: float

    @staticmethod
    def of(values: Sequence[float]) -> Spread:
        """The median and range of some values (at least one)."""
        return Spread(median=statistics.median(values), min=min(values), max=max(values))


@dataclass(frozen=True, slots=True, kw_only=True)
class LevelFigures:
    """Each figure of ``PassFigures`` over a level's (or a rate's) repetitions; None where no pass had it."""

    tokens_per_s: Spread | None = named("tokens_per_s")
    total_tokens_per_s: Spread | None = named("total_tokens_per_s")
    ttft_ms_p50: Spread | None = named("ttft_ms.p50")
    ttft_ms_p99: Spread | None = named("ttft_ms.p99")
    itl_ms_p50: Spread | None = named("itl_ms.p50")
    itl_ms_p99: Spread | None = named("itl_ms.p99")
    tpot_ms_p50: Spread | None = named("tpot_ms.p50")
    e2e_ms_p50: Spread | None = named("e2e_ms.p50")
    e2e_ms_p99: Spread | None = named("e2e_ms.p99")
    goodput_per_s: Spread | None = named("goodput_per_s")
    completed: Spread | None = named("completed")
    failed: Spread | None = named("failed")
    early_stops: Spread | None = named("early_stops")


FIGURES = tuple(
    Figure(attr=f.name, name=f.metadata["json"], unit=unit, meaning=meaning, higher_is_better=higher)
    for f in fields(PassFigures)
    for unit, meaning, higher in [f.metadata["figure"]]
)


def by_name(figures: PassFigures | LevelFigures) -> dict[str, Any]:
    """The figures keyed by their names in results.json (compare matches figures across kinds by name)."""
    return {f.name: getattr(figures, f.attr) for f in FIGURES}
