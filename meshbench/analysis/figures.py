"""The figures of a sweep, computed from its raw records (``meshbench.records.model``).

The sweep computes every figure here from the records it is about to write, and
``verify`` recomputes them from the records it read: one set of functions, one input
shape. (``verify`` also checks the deterministic ones a second, independent way.)
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Callable, Protocol, Sequence

from meshbench.analysis import latency, stats
from meshbench.engine import kinds
from meshbench.records.context import EngineInfo
from meshbench.records.documents import FirstDivergence
from meshbench.records.model import (
    FaultEvent,
    JsonObject,
    LevelRecord,
    Percentiles,
    SessionRecord,
    Summary,
    Timing,
    WallFigures,
    WallSummary,
)
from meshbench.records.tick import Tick
from meshbench.records.turns import by_turn, turn_numbers

SATURATION_MARGIN = 0.05  # occupancy must rise by more than 5% to count as still rising

# The per-level figures summarize_ticks returns: deterministic, compared exactly by --rerun.
TICK_FIGURES = (
    "ticks",
    "avg_batch_occupancy",
    "max_batch_occupancy",
    "tokens_per_tick",
    "peak_kv_bytes",
    "prefill_tokens",
    "decode_tokens",
)


def summarize_ticks(ticks: Sequence[Tick]) -> JsonObject:
    """The deterministic per-level figures (``TICK_FIGURES``, by name) from raw per-tick records."""
    batches = [t.decode_batch for t in ticks if t.decode_batch]
    prefill = sum(t.prefill_tokens for t in ticks)
    decode = sum(t.decode_tokens for t in ticks)
    n = len(ticks)
    return {
        "ticks": n,
        "avg_batch_occupancy": sum(batches) / len(batches) if batches else 0.0,
        "max_batch_occupancy": max(batches, default=0),
        "tokens_per_tick": (prefill + decode) / n if n else 0.0,
        "peak_kv_bytes": max((t.kv_bytes for t in ticks), default=0),
        "prefill_tokens": prefill,
        "decode_tokens": decode,
    }


def deterministic_ticks(ticks: Sequence[Tick]) -> list[Tick]:
    """Tick records without their timing: what every repetition must reproduce exactly."""
    return [dataclasses.replace(t, tick_ns=None, decode_ns=None, prefill_ns=None) for t in ticks]


def wall_figures(sessions: Sequence[Timing], ticks: Sequence[Tick], wall_s: float) -> WallFigures:
    """One repetition's wall-clock figures, from its monotonic nanosecond stamps (timed ticks).

    decode (prefill) tokens/s divide by the summed engine time of the decode (prefill)
    calls, as llama-batched-bench's S_TG (S_PP); tokens/s divides all tokens by the wall time.
    """
    prefill = sum(t.prefill_tokens for t in ticks)
    decode = sum(t.decode_tokens for t in ticks)
    tick_ns = sum(t.tick_ns or 0 for t in ticks)
    decode_ns = sum(t.decode_ns or 0 for t in ticks)
    prefill_ns = sum(t.prefill_ns or 0 for t in ticks)
    lat = latency.samples(sessions)
    return WallFigures(
        wall_s=wall_s,
        tokens_per_s=(prefill + decode) / wall_s if wall_s > 0 else 0.0,
        decode_tokens_per_s=decode / (decode_ns / 1e9) if decode_ns > 0 else 0.0,
        prefill_tokens_per_s=prefill / (prefill_ns / 1e9) if prefill_ns > 0 else 0.0,
        ttft_ms=latency.percentile_record(lat.ttft),
        queue_ms=latency.percentile_record(latency.queue_ms(sessions)),
        e2e_ms=latency.percentile_record(lat.e2e),
        itl_ms=latency.percentile_record(lat.itl),
        # TPOT, vLLM's definition: a session's mean gap between its tokens after the first.
        tpot_ms=latency.percentile_record(lat.tpot),
        scheduler_share=(tick_ns - decode_ns - prefill_ns) / tick_ns if tick_ns > 0 else 0.0,
    )


def scalar_figures(wall: WallFigures) -> dict[str, float]:
    """A repetition's wall figures flattened to ``name`` or ``name.p50`` -> value (None percentiles left out)."""
    out: dict[str, float] = {}
    for f in dataclasses.fields(wall):
        v = getattr(wall, f.name)
        if isinstance(v, Percentiles):
            out.update(
                {f"{f.name}.{q.name}": x for q in dataclasses.fields(v) if (x := getattr(v, q.name)) is not None}
            )
        else:
            out[f.name] = v
    return out


def repetition_summary(walls: Sequence[WallFigures]) -> WallSummary:
    """Per figure, over the repetitions: median, min, max and the median's confidence interval (a percentile left
    out where a repetition had no samples of it)."""

    def over(each: Callable[[WallFigures], float | None]) -> Summary | None:
        values = [each(w) for w in walls]
        return None if None in values else stats.summary([v for v in values if v is not None])

    def whole(each: Callable[[WallFigures], float]) -> Summary:
        return stats.summary([each(w) for w in walls])

    return WallSummary(
        wall_s=whole(lambda w: w.wall_s),
        tokens_per_s=whole(lambda w: w.tokens_per_s),
        decode_tokens_per_s=whole(lambda w: w.decode_tokens_per_s),
        prefill_tokens_per_s=whole(lambda w: w.prefill_tokens_per_s),
        ttft_ms_p50=over(lambda w: w.ttft_ms.p50),
        ttft_ms_p95=over(lambda w: w.ttft_ms.p95),
        ttft_ms_p99=over(lambda w: w.ttft_ms.p99),
        queue_ms_p50=over(lambda w: w.queue_ms.p50),
        queue_ms_p95=over(lambda w: w.queue_ms.p95),
        queue_ms_p99=over(lambda w: w.queue_ms.p99),
        e2e_ms_p50=over(lambda w: w.e2e_ms.p50),
        e2e_ms_p95=over(lambda w: w.e2e_ms.p95),
        e2e_ms_p99=over(lambda w: w.e2e_ms.p99),
        itl_ms_p50=over(lambda w: w.itl_ms.p50),
        itl_ms_p95=over(lambda w: w.itl_ms.p95),
        itl_ms_p99=over(lambda w: w.itl_ms.p99),
        tpot_ms_p50=over(lambda w: w.tpot_ms.p50),
        tpot_ms_p95=over(lambda w: w.tpot_ms.p95),
        tpot_ms_p99=over(lambda w: w.tpot_ms.p99),
        scheduler_share=whole(lambda w: w.scheduler_share),
    )


def token_digest(tokens: Sequence[int]) -> str:
    """sha256 of the decimal ids joined by commas: easy to recompute in any language."""
    return hashlib.sha256(",".join(str(t) for t in tokens).encode()).hexdigest()


class Served(Protocol):
    """A level, or the sessions run alone: a concurrency and its sessions' records."""

    @property
    def concurrency(self) -> int: ...

    @property
    def sessions(self) -> list[SessionRecord]: ...


def first_divergence(reference: Served, other: Served) -> FirstDivergence | None:
    """The first token where level ``other`` differs from level ``reference``, session by session.

    A session that ended early (cache miss, failure) is compared on the tokens it has; a session absent from
    the reference is not compared here (verify checks that every level holds the same ids).
    """
    ref = by_turn(reference.sessions)  # a conversation's turns, each its own (a session's one request: turn 1)
    turn = turn_numbers(other.sessions)
    for s in other.sessions:
        r = ref.get((s.session_id, turn[s.session_id, s.epoch]))
        if r is None:
            continue
        for i, (a, b) in enumerate(zip(r.tokens, s.tokens)):
            if a != b:
                return FirstDivergence(
                    session_id=s.session_id,
                    token_index=i,
                    reference_concurrency=reference.concurrency,
                    concurrency=other.concurrency,
                    reference_token=a,
                    token=b,
                    reference_margin=r.margins[i] if i < len(r.margins) else None,
                )
    return None


def sweep_divergence(levels: Sequence[LevelRecord], reference: Served | None = None) -> FirstDivergence | None:
    """The first divergence of any level from the reference: the sessions run alone when given
    (a sweep of arrivals), else the first level."""
    base: Served = reference or levels[0]
    for lv in levels:
        if lv is base:
            continue
        div = first_divergence(base, lv)
        if div is not None:
            return div
    return None


def fault_named(fault_events: Sequence[FaultEvent]) -> set[tuple[str, int]]:
    """(session, epoch) of every session an injected fault ended (a level's fault events name them)."""
    return {(s.session_id, s.epoch) for ev in fault_events for s in ev.sessions}


def unfinished_sessions(levels: Sequence[LevelRecord]) -> int:
    """Sessions that FAILED or never ended, except those an injected fault ended: such a sweep proves
    nothing about corruption."""
    count = 0
    for lv in levels:
        named = fault_named(lv.fault_events)
        count += sum(
            s.done_reason in ("FAILED", "UNFINISHED") and (s.session_id, s.epoch) not in named for s in lv.sessions
        )
    return count


def saturation_level(levels: Sequence[int], occupancy: Sequence[float], margin: float = SATURATION_MARGIN) -> int:
    """The lowest level after which average occupancy stops rising by more than ``margin``."""
    for i in range(len(levels) - 1):
        if occupancy[i + 1] <= occupancy[i] * (1.0 + margin):
            return levels[i]
    return levels[-1]


# A top-1 minus top-2 logit margin below this is a near-tie that kernel rounding can flip (on another CPU, another
# BLAS kernel or another llama.cpp build): such a bundle may not reproduce token for token there.
NEAR_TIE = 0.05
# The numpy engine in float64 moves a margin by about 1e-14 between CPUs (measured: DGR-012 on an Intel Xeon and an
# AMD EPYC); a margin a million times that is safe from any kernel's rounding.
NEAR_TIE_FLOAT64 = 1e-6


def near_tie(engine: EngineInfo) -> float:
    """The margin below which kernels that round differently may flip a token, for this engine's arithmetic."""
    return NEAR_TIE_FLOAT64 if float64(engine) else NEAR_TIE


def float64(engine: EngineInfo) -> bool:
    """numpy computed it in float64: exact to 2.2e-16 per operation, so its reruns and near-ties are held to that."""
    return engine.dtype == "float64" and kinds.recorded(engine.kind).numpy


@dataclasses.dataclass(frozen=True, slots=True)
class Margin:
    """A token's top-1 minus top-2 logit margin, and where it was."""

    margin: float
    session_id: str
    token: int
    concurrency: int


def smallest_margin(levels: Sequence[LevelRecord]) -> Margin | None:
    """The smallest recorded margin of any token at any level, and where: the token most likely to flip on kernels
    that round differently (None: no finite margin recorded)."""
    best: Margin | None = None
    for lv in levels:
        for s in lv.sessions:
            for t, m in enumerate(s.margins):
                if m is not None and (best is None or m < best.margin):
                    best = Margin(m, s.session_id, t, lv.concurrency)
    return best
