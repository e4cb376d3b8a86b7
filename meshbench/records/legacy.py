"""The records results.json holds, by name: each record's keys in one place (tests/test_fields.py holds
them equal to the results schema). The sweep builds them; analysis, verify, report and compare read them."""

from __future__ import annotations

from typing import Any, TypedDict

# A results record read back from JSON, before the typed model takes it over (issue 30): the one name for it.
from meshbench.records.model import JsonObject  # noqa: E402


class SessionRecord(TypedDict):
    """A session as it ended: what it was asked, what it produced, how it ended."""

    session_id: str
    epoch: int  # 1, then one more per resubmission after an engine loss
    prompt_tokens: int
    max_new_tokens: int
    tokens: list[int]
    digest: str  # sha256 of the tokens
    done_reason: str  # a DoneReason value, or UNFINISHED
    error: str | None
    margins: list[float | None]  # top-1 minus top-2 logit per token (null: not finite)
    end_tick: int | None


class SessionTiming(TypedDict):
    """A session's clock stamps, nanoseconds from the pass's start (wall data)."""

    session_id: str
    epoch: int
    digest: str
    done_reason: str
    submit_ns: int
    admit_ns: int | None
    token_ns: list[int]


class _Tick(TypedDict):
    tick: int
    decode_batch: int
    decode_sessions: list[str]
    decode_tokens: int
    prefill_tokens: int
    prefill_sessions: list[str]
    prefill_chunks: list[list[Any]]  # [session, first position, tokens]
    kv_bytes: int
    stored_tokens: int
    active: int
    queued: int
    completed: list[str]
    admitted: list[str]
    ended: list[str]
    resubmitted: list[str]
    decode_feed: list[list[Any]]  # [session, position, token]


class TickDict(_Tick, total=False):
    """One tick, raw (``TickRecord.to_dict``); the deterministic view (a level's tick_records) drops the times."""

    tick_ns: int
    decode_ns: int
    prefill_ns: int


class _Submit(TypedDict):
    tick: int
    session_id: str
    epoch: int | None
    decision: str  # an AdmissionReason value
    active: int
    queued: int


class SubmitEvent(_Submit, total=False):
    """One arrival: the tick before which it was submitted, the decision and the node's state then."""

    arrival_ms: float  # the wall clock only
    submit_ms: float


class LevelRecord(TypedDict):
    """One concurrency level (one arrival rate, one fault row) of a sweep."""

    concurrency: int
    arrivals: str
    rate: float | None
    budget: JsonObject
    faults: list[str]
    arrival_times: list[Any]
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
    counts: JsonObject
    sessions: list[SessionRecord]
    tick_records: list[TickDict]
    submit_events: list[SubmitEvent]
    backpressure: JsonObject
    fault_events: list[JsonObject]
    engine_losses: list[JsonObject]
    wall: JsonObject
    repetitions: list[JsonObject]
    isolation: JsonObject
    isolation_verdict: JsonObject
