"""What an engine kind hands the sweep: a factory of fresh engines and the facts results.json records."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from meshbench.engine.base import BatchEngine, EngineLimits
from meshbench.records import serial
from meshbench.records.context import GgufEngineInfo, SyntheticEngineInfo

EngineRecord = SyntheticEngineInfo | GgufEngineInfo  # results.json's engine record, of whichever kind ran


@dataclass(frozen=True, slots=True)
class EngineSizing:
    """What a run will ask of its engines, known before any is built: the longest session's positions, the
    most sessions at once, the longest prompt (a llama.cpp context is sized by them)."""

    max_total_tokens: int
    max_sessions: int
    max_prompt: int
    burst: bool = False  # a tick may prefill every session's prompt at once (prefill burst)


@dataclass(slots=True)
class EngineSetup:
    make: Callable[[EngineLimits], BatchEngine]  # one fresh engine (fresh KV) per call
    info: EngineRecord  # what results.json records about the engine, typed when described
    vocab_size: int
    context_length: int
    resource: object = None  # what must stay alive while engines run (a loaded model)
    # An engine in its own process: a new engine after a loss, and the fault plan's kills (else None).
    restart: Callable[[EngineLimits], BatchEngine] | None = None
    kill_engine: Callable[[], None] | None = None
    kill_worker: Callable[[int], None] | None = None
    eog: frozenset[int] = frozenset()  # the model's end-of-generation tokens (eos: stop ends sessions on them)

    def close(self) -> None:
        """Free what the engines share (a loaded model) now, not at garbage collection."""
        close = getattr(self.resource, "close", None)
        if close is not None:
            close()


def close_engine(engine: BatchEngine) -> None:
    """Free an engine's native state now (a llama.cpp context), not at garbage collection: before its
    model, and while the RPC workers holding its buffers still serve them."""
    engine.close()


def describe(probe: BatchEngine, kind: str, **facts: object) -> EngineRecord:
    """The engine record of results.json: the kind's own ``facts`` plus the figures every engine reports, typed
    once, here (a fact the record has no field for is refused)."""
    return serial.engine_info(
        {
            "kind": kind,
            **facts,
            "recipe_fingerprint": probe.recipe_fingerprint,
            "kv_bytes_per_token": probe.kv_bytes_per_token,
            "weight_bytes": probe.weight_bytes,
            "scratch_bytes_per_session": probe.scratch_bytes_per_session,
        },
        "the engine's record",
    )
