"""The concurrency sweep: the same jobs at every level, a fresh engine per level.

At level c the node allows c active sessions and a batch of c; every job is submitted
before the first tick and the queue holds them all. Deterministic figures (ticks,
occupancy, KV, tokens) come from the scheduler; wall-clock figures are reported beside
them and never compared byte for byte.
"""

from __future__ import annotations

import dataclasses
import hashlib
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from meshbench.engine.base import BatchEngine
from meshbench.errors import MeshbenchError
from meshbench.scheduler.budget import NodeBudget
from meshbench.scheduler.scheduler import ContinuousBatchScheduler
from meshbench.scheduler.session import GenerationRequest, Session
from meshbench.scheduler.telemetry import TickRecord

SATURATION_MARGIN = 0.05  # occupancy must rise by more than 5% to count as still rising


@dataclass(frozen=True, slots=True)
class Workload:
    """One prompt length and one new-token count per session; prompt ids drawn from ``seed``."""

    prompt_tokens: tuple[int, ...]
    new_tokens: tuple[int, ...]
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.prompt_tokens:
            raise MeshbenchError("workload: at least one session is needed")
        if len(self.prompt_tokens) != len(self.new_tokens):
            raise MeshbenchError(
                f"workload: {len(self.prompt_tokens)} prompt lengths but {len(self.new_tokens)} new-token counts"
            )
        for name, values in (("prompt_tokens", self.prompt_tokens), ("new_tokens", self.new_tokens)):
            bad = [v for v in values if v < 1]
            if bad:
                raise MeshbenchError(f"workload: {name} must be >= 1 for every session, got {bad[0]}")

    @classmethod
    def uniform(cls, sessions: int, prompt_tokens: int, new_tokens: int, seed: int = 0) -> "Workload":
        return cls((prompt_tokens,) * sessions, (new_tokens,) * sessions, seed)

    @property
    def sessions(self) -> int:
        return len(self.prompt_tokens)

    def requests(self, vocab_size: int) -> list[GenerationRequest]:
        rng = np.random.default_rng(self.seed)
        width = len(str(self.sessions - 1))
        return [
            GenerationRequest(f"s{i:0{width}d}", tuple(int(t) for t in rng.integers(0, vocab_size, p)), n)
            for i, (p, n) in enumerate(zip(self.prompt_tokens, self.new_tokens))
        ]

    def to_dict(self) -> dict:
        return {"sessions": self.sessions, "prompt_tokens": list(self.prompt_tokens),
                "new_tokens": list(self.new_tokens), "seed": self.seed}


def token_digest(tokens: Sequence[int]) -> str:
    """sha256 of the decimal ids joined by commas: easy to recompute in any language."""
    return hashlib.sha256(",".join(str(t) for t in tokens).encode()).hexdigest()


@dataclass(slots=True)
class SessionRecord:
    session_id: str
    prompt_tokens: int
    max_new_tokens: int
    tokens: list[int]
    margins: list[float]
    digest: str
    done_reason: str
    error: str | None
    submit_ns: int  # relative to the level's start
    token_ns: list[int]  # relative to the level's start

    @classmethod
    def of(cls, s: Session, t0: int) -> "SessionRecord":
        return cls(s.session_id, s.prompt_len, s.request.max_new_tokens, list(s.tokens), list(s.margins),
                   token_digest(s.tokens), s.done_reason.value if s.done_reason else "UNFINISHED", s.error,
                   s.submit_ns - t0, [t - t0 for t in s.token_ns])


@dataclass(slots=True)
class ConcurrencyResult:
    concurrency: int
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
    sessions: list[SessionRecord]
    tick_records: list[TickRecord]
    wall: dict = field(default_factory=dict)


@dataclass(slots=True)
class ConcurrencySweep:
    levels: list[ConcurrencyResult]
    corruption_free: bool
    first_divergence: dict | None
    saturation_concurrency: int
    reference_concurrency: int


def summarize_ticks(ticks: Sequence) -> dict:
    """The deterministic per-level figures, from raw per-tick records (objects or dicts)."""
    get = (lambda t, k: t[k]) if ticks and isinstance(ticks[0], dict) else getattr
    batches = [get(t, "decode_batch") for t in ticks if get(t, "decode_batch")]
    prefill = sum(get(t, "prefill_tokens") for t in ticks)
    decode = sum(get(t, "decode_tokens") for t in ticks)
    n = len(ticks)
    return {
        "ticks": n,
        "avg_batch_occupancy": sum(batches) / len(batches) if batches else 0.0,
        "max_batch_occupancy": max(batches, default=0),
        "tokens_per_tick": (prefill + decode) / n if n else 0.0,
        "peak_kv_bytes": max((get(t, "kv_bytes") for t in ticks), default=0),
        "prefill_tokens": prefill,
        "decode_tokens": decode,
    }


def percentiles(values: Sequence[float]) -> dict:
    if not values:
        return {"p50": None, "p95": None, "p99": None}
    a = np.asarray(values, dtype=np.float64)
    return {f"p{q}": float(np.percentile(a, q)) for q in (50, 95, 99)}


def wall_figures(sessions: Sequence[SessionRecord], ticks: Sequence[TickRecord], wall_ns: int) -> dict:
    """Wall-clock figures from monotonic nanosecond stamps: reported, never compared."""
    s = wall_ns / 1e9
    prefill = sum(t.prefill_tokens for t in ticks)
    decode = sum(t.decode_tokens for t in ticks)
    tick_ns = sum(t.tick_ns for t in ticks)
    engine_ns = sum(t.engine_ns for t in ticks)
    ttft = [(r.token_ns[0] - r.submit_ns) / 1e6 for r in sessions if r.token_ns]
    itl = [(b - a) / 1e6 for r in sessions for a, b in zip(r.token_ns, r.token_ns[1:])]
    return {
        "wall_s": s,
        "tokens_per_s": (prefill + decode) / s if s > 0 else 0.0,
        "prefill_tokens_per_s": prefill / s if s > 0 else 0.0,
        "decode_tokens_per_s": decode / s if s > 0 else 0.0,
        "ttft_ms": percentiles(ttft),
        "itl_ms": percentiles(itl),
        "scheduler_share": (tick_ns - engine_ns) / tick_ns if tick_ns > 0 else 0.0,
    }


def level_budget(base: NodeBudget, concurrency: int, sessions: int) -> NodeBudget:
    return dataclasses.replace(
        base, max_active_sessions=concurrency, max_batch_size=concurrency,
        max_queue_depth=max(base.max_queue_depth, sessions),
    )


def run_level(
    concurrency: int,
    requests: Sequence[GenerationRequest],
    budget: NodeBudget,
    engine: BatchEngine,
    clock: Callable[[], int] = time.monotonic_ns,
    on_tick: Callable[[TickRecord], None] | None = None,
) -> ConcurrencyResult:
    sched = ContinuousBatchScheduler(engine, budget, clock)
    t0 = clock()
    rejected = sum(not sched.submit(r).accepted for r in requests)
    bound = sum(r.max_new_tokens for r in requests) + 1
    n_ticks = 0
    while sched.has_work():
        if n_ticks >= bound:
            raise MeshbenchError(f"level {concurrency}: the sweep did not finish within {bound} ticks")
        rec = sched.run_tick()
        n_ticks += 1
        if on_tick is not None:
            on_tick(rec)
    wall_ns = clock() - t0
    ticks = sched.ticks()
    sessions = [SessionRecord.of(s, t0) for s in sched.sessions()]
    tel = sched.telemetry()
    summary = summarize_ticks(ticks)
    return ConcurrencyResult(
        concurrency=concurrency,
        rejected_admissions=rejected,
        cache_misses=tel.cache_misses,
        failed=tel.failed,
        sessions=sessions,
        tick_records=ticks,
        wall=wall_figures(sessions, ticks, wall_ns),
        **summary,
    )


def find_divergence(reference: ConcurrencyResult, other: ConcurrencyResult) -> dict | None:
    """The first token where ``other`` differs from ``reference``, session by session."""
    return first_divergence(
        reference.concurrency, {s.session_id: (s.tokens, s.margins) for s in reference.sessions},
        other.concurrency, [(s.session_id, s.tokens) for s in other.sessions],
    )


def first_divergence(ref_level: int, ref: dict, level: int, sessions: Sequence) -> dict | None:
    """``ref`` maps session id to (tokens, margins); ``sessions`` is [(session id, tokens)].

    A session that ended early (cache miss, failure) is compared on the tokens it has.
    """
    for sid, tokens in sessions:
        if sid not in ref:
            continue
        ref_tokens, ref_margins = ref[sid]
        for i, (a, b) in enumerate(zip(ref_tokens, tokens)):
            if a != b:
                return {
                    "session_id": sid, "token_index": i, "reference_concurrency": ref_level,
                    "concurrency": level, "reference_token": a, "token": b,
                    "reference_margin": ref_margins[i] if i < len(ref_margins) else None,
                }
    return None


def saturation_level(levels: Sequence[int], occupancy: Sequence[float], margin: float = SATURATION_MARGIN) -> int:
    """The lowest level after which average occupancy stops rising by more than ``margin``."""
    for i in range(len(levels) - 1):
        if occupancy[i + 1] <= occupancy[i] * (1.0 + margin):
            return levels[i]
    return levels[-1]


def validate_levels(levels: Sequence[int], sessions: int) -> list[int]:
    if not levels:
        raise MeshbenchError("levels: at least one concurrency level is needed")
    bad = [lv for lv in levels if lv < 1]
    if bad:
        raise MeshbenchError(f"levels: every level must be >= 1, got {bad[0]}")
    if len(set(levels)) != len(levels):
        raise MeshbenchError(f"levels: duplicate level in {','.join(map(str, levels))}")
    over = [lv for lv in levels if lv > sessions]
    if over:
        raise MeshbenchError(
            f"levels: level {over[0]} exceeds the {sessions} sessions of the workload (refused, not clamped: "
            "a level above the session count measures nothing new)"
        )
    return sorted(levels)


def run_concurrency_sweep(
    levels: Sequence[int],
    workload: Workload,
    budget: NodeBudget,
    engine_factory: Callable[[NodeBudget], BatchEngine],
    clock: Callable[[], int] = time.monotonic_ns,
    on_tick: Callable[[int, TickRecord], None] | None = None,
) -> ConcurrencySweep:
    ordered = validate_levels(levels, workload.sessions)
    results: list[ConcurrencyResult] = []
    for c in ordered:
        b = level_budget(budget, c, workload.sessions)
        engine = engine_factory(b)  # a fresh KV manager per level
        requests = workload.requests(engine.vocab_size)
        cb = (lambda rec, c=c: on_tick(c, rec)) if on_tick else None
        results.append(run_level(c, requests, b, engine, clock, cb))
    reference = results[0]
    divergence = None
    for r in results[1:]:
        divergence = find_divergence(reference, r)
        if divergence is not None:
            break
    # A session that failed proves nothing about corruption: such a sweep is not corruption free.
    unfinished = sum(s.done_reason in ("FAILED", "UNFINISHED") for r in results for s in r.sessions)
    return ConcurrencySweep(
        levels=results,
        corruption_free=divergence is None and unfinished == 0,
        first_divergence=divergence,
        saturation_concurrency=saturation_level([r.concurrency for r in results],
                                                [r.avg_batch_occupancy for r in results]),
        reference_concurrency=reference.concurrency,
    )

