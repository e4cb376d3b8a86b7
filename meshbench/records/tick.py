"""One tick of the node's scheduler, the one record of it: the scheduler builds it (``scheduler.telemetry.of_plan``),
results.json holds it, verify reads it. Each field carries its JSON schema, from which ``tick_schema`` writes the
results schema's ``tick_record`` (a level's deterministic ticks: no times) and ``timed_tick_record`` (a
repetition's)."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field, fields
from typing import Any

JsonObject = dict[str, Any]
_COUNT: JsonObject = {"type": "integer", "minimum": 0}
_IDS: JsonObject = {"type": "array", "items": {"type": "string"}}
TIMES = ("tick_ns", "decode_ns", "prefill_ns")  # what a deterministic tick leaves out


def _is(schema: JsonObject, why: str | None = None, required: bool = True) -> Any:
    """A field whose value ``schema`` describes (with ``why``, its description); not required: None by default."""
    meta = {"schema": {**schema, **({"description": why} if why else {})}}
    return field(metadata=meta) if required else field(default=None, metadata=meta)


def _triples(least_last: int) -> JsonObject:
    """[session, position, n]: a session id and two counts, the last at least ``least_last``."""
    items = [{"type": "string"}, _COUNT, {"type": "integer", "minimum": least_last}]
    return {"type": "array", "items": {"type": "array", "prefixItems": items, "minItems": 3, "maxItems": 3}}


@dataclass(frozen=True, slots=True, kw_only=True)
class Tick:
    """One tick. A level's ``tick_records`` are deterministic (no times); a repetition's are timed."""

    tick: int = _is(_COUNT)
    decode_batch: int = _is(_COUNT)
    decode_sessions: list[str] = _is(_IDS)
    decode_tokens: int = _is(_COUNT)
    prefill_tokens: int = _is(_COUNT)
    prefill_sessions: list[str] = _is(_IDS)
    prefill_chunks: list[list[Any]] = _is(
        _triples(1),
        "(session, first position, tokens) of every prompt piece written in the tick; prefill_sessions are the "
        "sessions whose last piece ran.",
    )
    kv_bytes: int = _is(_COUNT)
    stored_tokens: int = _is(_COUNT)
    active: int = _is(_COUNT)
    queued: int = _is(_COUNT)
    completed: list[str] = _is(_IDS)
    admitted: list[str] = _is(_IDS)
    ended: list[str] = _is(
        _IDS, "Sessions that ended otherwise than completing: cancelled before the tick, failed or missed in it."
    )
    resubmitted: list[str] = _is(
        _IDS, "Sessions lost with their engine and submitted again in this tick, under a new epoch."
    )
    tick_ns: int | None = _is(_COUNT, required=False)
    decode_ns: int | None = _is(_COUNT, required=False)
    prefill_ns: int | None = _is(_COUNT, required=False)
    decode_feed: list[list[Any]] = _is(_triples(0))  # [session, position, token]
    prefix_hit_tokens: int | None = _is(
        _COUNT,
        "With a prefix cache: prompt positions this tick's chunks took from it instead of computing them.",
        required=False,
    )
    kv_bytes_shared: int | None = _is(
        _COUNT,
        "With a prefix cache: the bytes of its blocks at the end of the tick, referenced or not (part of kv_bytes).",
        required=False,
    )


def tick_schema(timed: bool) -> JsonObject:
    """The results schema's tick record, from the fields: every field a tick must have required (the times too
    where ``timed``), the times left out of a deterministic one."""
    kept = [f for f in fields(Tick) if timed or f.name not in TIMES]
    required = [f.name for f in kept if f.default is not None or f.name in TIMES]
    properties = {f.name: f.metadata["schema"] for f in kept}
    schema = {"type": "object", "required": required, "additionalProperties": False, "properties": properties}
    return copy.deepcopy(schema)  # (the fields' own, and the lists of ids they share, kept as they are)
