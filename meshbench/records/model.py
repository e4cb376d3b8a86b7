"""The records a node sweep's results.json holds, typed: frozen dataclasses, one per record, built complete.

Field order is the order results.json writes. Only ``meshbench.records.serial`` turns them into JSON and
back (tests/test_records.py holds every field to the results schema, both ways). A record's optional key
(``SubmitEvent.arrival_ms``, a tick's timing) is a field that defaults to None and is left out when None.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from meshbench.records.canary import CanaryRun
from meshbench.records.cancel import CancelRun
from meshbench.records.completion import Completion as Completion  # (re-exported: an endpoint answer)
from meshbench.records.context import Budget
from meshbench.records.endpoint_figures import LevelFigures, PassFigures
from meshbench.records.perturbation import Perturbation
from meshbench.records.sharing import CacheVerdict, PrefixStats
from meshbench.records.tick import Tick

JsonObject = dict[str, Any]  # what is typed by its own owner: the config echo (a RunConfig's), a model's config


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionRecord:
    """A session as it ended: what it was asked, what it produced, how it ended."""

    session_id: str
    epoch: int  # 1, then one more per resubmission after an engine loss
    end_tick: int | None
    prompt_tokens: int
    max_new_tokens: int
    tokens: list[int]
    margins: list[float | None]  # top-1 minus top-2 logit per token (None: not finite)
    digest: str  # sha256 of the tokens (meshbench.analysis.figures.token_digest)
    done_reason: str  # a DoneReason value, or UNFINISHED
    error: str | None
    cached_tokens: int | None = None  # with a prefix cache: prompt positions taken from it, not computed


@dataclass(frozen=True, slots=True, kw_only=True)
class Timing:
    """A session's clock stamps in one pass, nanoseconds from the pass's start: the timing record a node's
    session and an endpoint's completion share (``meshbench.analysis.latency`` reads nothing else)."""

    session_id: str
    epoch: int
    digest: str
    done_reason: str
    submit_ns: int
    admit_ns: int | None  # None: no slot ever took it
    token_ns: list[int]  # one stamp per token received


@dataclass(frozen=True, slots=True, kw_only=True)
class SubmitEvent:
    """One arrival: the tick before which it was submitted, the decision and the node's state then."""

    tick: int
    session_id: str
    epoch: int | None
    decision: str  # an AdmissionReason value
    active: int
    queued: int
    arrival_ms: float | None = None  # the wall clock only
    submit_ms: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Percentiles:
    p50: float | None
    p95: float | None
    p99: float | None


@dataclass(frozen=True, slots=True, kw_only=True)
class WallFigures:
    """One repetition's wall-clock figures (``meshbench.analysis.figures.wall_figures``)."""

    wall_s: float
    tokens_per_s: float
    decode_tokens_per_s: float
    prefill_tokens_per_s: float
    ttft_ms: Percentiles
    queue_ms: Percentiles
    e2e_ms: Percentiles
    itl_ms: Percentiles
    tpot_ms: Percentiles
    scheduler_share: float


@dataclass(frozen=True, slots=True, kw_only=True)
class Summary:
    """A figure over the repetitions: median, min, max, and with n >= 5 the median's confidence interval."""

    n: int
    median: float
    min: float
    max: float
    ci_low: float | None
    ci_high: float | None
    ci_level: float | None


def _percentile(name: str) -> Any:
    """A level's summary of a percentile, keyed ``name`` in results.json, left out where no repetition had it."""
    return field(default=None, metadata={"json": name})


@dataclass(frozen=True, slots=True, kw_only=True)
class WallSummary:
    """Each figure of ``WallFigures`` over a level's repetitions (``meshbench.analysis.figures.repetition_summary``),
    a percentile under its name in results.json (``ttft_ms.p50``); None where a repetition had no samples of it."""

    wall_s: Summary
    tokens_per_s: Summary
    decode_tokens_per_s: Summary
    prefill_tokens_per_s: Summary
    ttft_ms_p50: Summary | None = _percentile("ttft_ms.p50")
    ttft_ms_p95: Summary | None = _percentile("ttft_ms.p95")
    ttft_ms_p99: Summary | None = _percentile("ttft_ms.p99")
    queue_ms_p50: Summary | None = _percentile("queue_ms.p50")
    queue_ms_p95: Summary | None = _percentile("queue_ms.p95")
    queue_ms_p99: Summary | None = _percentile("queue_ms.p99")
    e2e_ms_p50: Summary | None = _percentile("e2e_ms.p50")
    e2e_ms_p95: Summary | None = _percentile("e2e_ms.p95")
    e2e_ms_p99: Summary | None = _percentile("e2e_ms.p99")
    itl_ms_p50: Summary | None = _percentile("itl_ms.p50")
    itl_ms_p95: Summary | None = _percentile("itl_ms.p95")
    itl_ms_p99: Summary | None = _percentile("itl_ms.p99")
    tpot_ms_p50: Summary | None = _percentile("tpot_ms.p50")
    tpot_ms_p95: Summary | None = _percentile("tpot_ms.p95")
    tpot_ms_p99: Summary | None = _percentile("tpot_ms.p99")
    scheduler_share: Summary


@dataclass(frozen=True, slots=True, kw_only=True)
class Repetition:
    """One recorded pass of a level: its place in the run, its timed ticks and stamps, its wall figures."""

    repetition: int
    position: int  # in that repetition's (rotated) level order
    wall_s: float
    tick_records: list[Tick]
    sessions: list[Timing]
    wall: WallFigures


@dataclass(frozen=True, slots=True, kw_only=True)
class PassSession:
    session_id: str
    digest: str
    margins_digest: str
    epoch: int | None = None  # conversations: the turn (written where a session has more than one)


@dataclass(frozen=True, slots=True, kw_only=True)
class IsolationPass:
    """One perturbation pass: whom it perturbed, its schedule's digest, each session's digests."""

    perturbed: list[str]
    confirm: bool
    schedule_digest: str
    sessions: list[PassSession]


@dataclass(frozen=True, slots=True, kw_only=True)
class IsolationRecords:
    """A level's perturbation passes, or (``passes`` None) why it has none."""

    sessions: list[str] | None
    passes: list[IsolationPass] | None
    reason: str | None
    groups: dict[str, list[str]] | None = None  # shared prefixes, perturbed as units: "prefix:G" -> its sharers


@dataclass(frozen=True, slots=True, kw_only=True)
class IsolationVerdict:
    """A level's isolation verdict (``meshbench.analysis.isolation.verdict``)."""

    ran: bool
    holds: bool | None
    schedule_changed: list[int]
    changed: list[str]
    leaks: list[list[str]]  # [victim, culprit]
    separating: bool | None
    family_passes: int
    escape_bits: int | None
    confirmations: int
    suspects: dict[str, list[str]]
    reason: str | None


@dataclass(frozen=True, slots=True, kw_only=True)
class Resubmission:
    """A session lost with its engine, submitted again under a new epoch: the admission's decision."""

    session_id: str
    epoch: int | None  # None: refused
    decision: str


@dataclass(frozen=True, slots=True, kw_only=True)
class FaultSession:
    """A session an injected fault ended, as it ended."""

    session_id: str
    epoch: int
    done_reason: str
    end_tick: int | None
    error: str | None


@dataclass(frozen=True, slots=True, kw_only=True)
class FaultEvent:
    """One injected fault (meshbench.sweep.inject): when it fired, what it hit, whom it ended."""

    fault: str  # its spec, as the row gives it
    tick: int
    hit: str
    sessions: list[FaultSession]
    cause: str | None  # a process fault's engine loss
    resubmitted: list[Resubmission]


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineLoss:
    """An engine lost in a tick: the sessions lost (id, epoch), and what was resubmitted after a restart."""

    tick: int
    cause: str
    lost: list[list[Any]]  # [session, epoch]
    resubmitted: list[Resubmission]
    restart_error: str | None = None  # the restart failed: the node went down


@dataclass(frozen=True, slots=True, kw_only=True)
class Backpressure:
    """A level's admissions, queue, waits, TTFT and TPOT in ticks, and goodput per 100 ticks
    (``meshbench.analysis.backpressure``); on the wall clock also waits and rates in ms and per second."""

    offered: int
    admitted_at_once: int
    queued: int
    rejected_by_reason: dict[str, int]
    completed: int
    queue_depth_max: int
    queue_depth_mean: float
    queue_wait_ticks: dict[str, float | None]  # p50, p95, max
    ttft_ticks: dict[str, float | None]  # p50, p95, p99, max
    tpot_ticks: dict[str, float | None]
    good_sessions: int
    offered_per_100_ticks: float
    accepted_per_100_ticks: float
    rejected_per_100_ticks: float
    completed_per_100_ticks: float
    goodput_per_100_ticks: float
    queue_wait_ms: dict[str, float | None] | None = None
    ttft_from_arrival_ms: dict[str, float | None] | None = None
    offered_per_s: float | None = None
    accepted_per_s: float | None = None
    rejected_per_s: float | None = None
    completed_per_s: float | None = None
    good_sessions_wall: int | None = None
    goodput_per_s: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class LevelRecord:
    """One concurrency level (one arrival rate, one fault row) of a sweep, complete when built."""

    concurrency: int
    arrivals: str
    rate: float | None
    budget: Budget
    ticks: int
    avg_batch_occupancy: float
    max_batch_occupancy: int
    tokens_per_tick: float
    peak_kv_bytes: int
    prefill_tokens: int
    decode_tokens: int
    rejected_admissions: int
    cache_misses: int
    failed: int
    counts: dict[str, int]
    faults: list[str]
    fault_events: list[FaultEvent]
    engine_losses: list[EngineLoss]
    arrival_times: list[float]  # per session: its arrival tick (int), or on the wall clock its time in ms
    submit_events: list[SubmitEvent]
    sessions: list[SessionRecord]
    tick_records: list[Tick]
    backpressure: Backpressure
    repetitions: list[Repetition]
    wall: WallSummary
    isolation: IsolationRecords
    isolation_verdict: IsolationVerdict
    turn_events: list[SubmitEvent] | None = None  # conversations: one per later turn submitted, in order
    # with a prefix cache: what it did, the level's sessions run once more with it off, and the verdict
    prefix: PrefixStats | None = None
    cache_off: list[SessionRecord] | None = None
    cache_verdict: CacheVerdict | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Reference:
    """An arrival sweep's reference: every session run alone (level 1, all at once)."""

    concurrency: int
    sessions: list[SessionRecord]


@dataclass(frozen=True, slots=True, kw_only=True)
class GaugeSample:
    """The server's request gauges read once while a pass ran (meshbench.endpoint.gauges)."""

    t_ms: float  # when the scrape was sent, from the pass's start
    answer_ms: float  # when its answer was in (the server read its state in between)
    processing: int  # requests in a slot (llama-server's requests_processing)
    deferred: int  # requests waiting for a slot (requests_deferred)


@dataclass(frozen=True, slots=True, kw_only=True)
class EndpointRepetition:
    """One pass of an endpoint level: its completions, the server's metrics around it, its figures."""

    repetition: int
    position: int
    wall_s: float
    sessions: list[Completion]
    metrics_before: dict[str, float] | None
    metrics_after: dict[str, float] | None
    figures: PassFigures
    # the gauges sampled during the pass (absent: the server has none, or the bundle was made before sampling)
    gauges: list[GaugeSample] | None = None
    # conversations (workload.turns > 1): every session's later turns, session by session, each turn after the one
    # before it (a turn after a failed one is not sent); ``sessions`` holds the first turns. None: one turn each
    turns: list[Completion] | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class NeedleTrial:
    """The needle session among ``neighbours``, at ``position`` in their submission."""

    repetition: int
    position: int
    neighbours: list[str]
    completion: Completion


@dataclass(frozen=True, slots=True, kw_only=True)
class EndpointLevel:
    """One concurrency level of an endpoint sweep."""

    concurrency: int
    repetitions: list[EndpointRepetition]
    needle: list[NeedleTrial]
    figures: LevelFigures  # each figure's median, min and max over the repetitions
    perturbation: Perturbation | None = None  # (native API, C >= 2; absent from bundles made before it)
    # the same test through the server's prompt cache, each run primed with its neighbours' prompts (native API,
    # C >= 2, where the sweep's requests do not send cache_prompt false; absent from bundles made before it)
    perturbation_cache: Perturbation | None = None
    canary: CanaryRun | None = None  # (absent from bundles made before canaries)
    cancel: CancelRun | None = None  # (native API, C >= 2, unless off; absent from bundles made before it)
