"""A whole results.json of each kind, typed: a node sweep's (``NodeResults``) and an endpoint sweep's
(``EndpointResults``), with the sweep-wide verdicts each holds. Only ``meshbench.records.serial`` turns them
into JSON and back."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from meshbench.errors import MeshbenchError
from meshbench.records.canary import CanarySearch
from meshbench.records.context import (
    Budget,
    EndpointInfo,
    EndpointWorkload,
    Environment,
    GgufEngineInfo,
    InputFile,
    JsonObject,
    SyntheticEngineInfo,
    Workload,
)
from meshbench.records.conversation import ConversationCold
from meshbench.records.margins import Divergences, MarginPasses
from meshbench.records.model import Completion, EndpointLevel, LevelRecord, Reference
from meshbench.records.open_loop import EndpointRate


@dataclass(frozen=True, slots=True, kw_only=True)
class SweepIsolation:
    """How a sweep's isolation was proven, at how many levels, and whether it holds."""

    method: str
    levels_run: int
    every_level: bool
    holds: bool | None  # None: no level could run it


@dataclass(frozen=True, slots=True, kw_only=True)
class LogitDeviation:
    """How the diverging session's logits moved, both levels' recorded schedules replayed."""

    first_batched_step: int | None
    at_first_batched_step: float | None
    first_differing_step: int | None
    batch_at_first_differing_step: int | None
    max_abs_logit_diff: float | None
    logit_range: list[float]


@dataclass(frozen=True, slots=True, kw_only=True)
class FirstDivergence:
    """Where the first level's tokens left the reference's, and why (its class, from the oracle)."""

    session_id: str
    token_index: int
    reference_concurrency: int
    concurrency: int
    reference_token: int
    token: int
    reference_margin: float | None
    classification: str | None = None  # (the gguf engine's: the oracle's class)
    logit_deviation: LogitDeviation | None = None  # (None: an isolated engine, or an arrival sweep)


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeResults:
    """A node sweep's results.json: the header and config echo, the engine and environment, the level records,
    and the sweep's verdicts (meshbench.results.document.build), complete when built."""

    schema_version: int
    meshbench_version: str
    created_at: str
    command: str
    story: str
    title: str | None = None
    config: JsonObject  # the whole config (a RunConfig's to_dict; meshbench.workload.config.from_mapping types it)
    engine: SyntheticEngineInfo | GgufEngineInfo
    workload: Workload
    budget: Budget
    environment: Environment
    levels: list[LevelRecord]
    corruption_free: bool
    batch_invariant: bool
    isolation: SweepIsolation
    first_divergence: FirstDivergence | None
    saturation_concurrency: int | None
    saturation_margin: float
    reference_concurrency: int
    reference: Reference | None
    saturation_rates: dict[int, float | None] | None  # by concurrency
    inputs: dict[str, InputFile] | None = None  # input files by config key (workload.prompts), as they were

    def __post_init__(self) -> None:
        by_level("saturation_rates", self.saturation_rates, [lv.concurrency for lv in self.levels], every=False)


@dataclass(frozen=True, slots=True, kw_only=True)
class NeedleVerdict:
    """One level's needle: its trials, its distinct outputs, how many differ from its output alone."""

    trials: int
    distinct: int
    differs_from_alone: int | None


@dataclass(frozen=True, slots=True, kw_only=True)
class EndpointVerdicts:
    """What an endpoint sweep concludes, per level and overall (``meshbench.analysis.endpoint``)."""

    compared: str  # tokens or text
    reference_concurrency: int
    failed: dict[int, int]  # each map here by concurrency (results.json's keys: its decimal digits)
    batch_invariant: bool
    differing_sessions: dict[int, list[str]]
    run_to_run_deterministic: bool
    distinct_outputs: dict[int, dict[str, int]]
    needle: dict[int, NeedleVerdict]
    needle_stable: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class Needle:
    """The needle session: whose prompt it is, and its answer alone."""

    prompt_of: str
    alone: Completion


@dataclass(frozen=True, slots=True, kw_only=True)
class EndpointResults:
    """An endpoint sweep's results.json (endpoint.schema.json)."""

    kind: str
    schema_version: int
    meshbench_version: str
    created_at: str
    command: str
    story: str
    title: str
    config: JsonObject
    environment: Environment
    endpoint: EndpointInfo
    workload: EndpointWorkload
    needle: Needle
    levels: list[EndpointLevel]
    verdicts: EndpointVerdicts
    conclusions: dict[str, str]
    margins: MarginPasses | None = None  # (native API; absent from bundles made before margins were asked for)
    divergences: Divergences | None = None  # recomputed by verify from the levels and the margin passes
    canaries: CanarySearch | None = None  # recomputed by verify from every answer (absent before canaries)
    rates: list[EndpointRate] | None = None  # the open-loop passes, where config.rates asks for them
    conversations: ConversationCold | None = None  # workload.turns > 1: the later turns sent again cold

    def __post_init__(self) -> None:
        levels = [lv.concurrency for lv in self.levels]
        v = self.verdicts
        for name, m in (("failed", v.failed), ("differing_sessions", v.differing_sessions),
                        ("distinct_outputs", v.distinct_outputs), ("needle", v.needle)):  # fmt: skip
            by_level(f"verdicts.{name}", m, levels)
        if self.divergences is not None:
            by_level("divergences.levels", self.divergences.levels, levels)


def by_level(name: str, keys: Iterable[int] | None, levels: list[int], every: bool = True) -> None:
    """A map by concurrency holds the document's levels: every one in their order (``every``), or some of them."""
    if keys is None:
        return
    got = list(keys)
    if got != levels if every else not set(got) <= set(levels):
        said = "the levels {} in order" if every else "some of the levels {}"
        raise MeshbenchError(f"{name}: by concurrency {got}, not " + said.format(levels))
