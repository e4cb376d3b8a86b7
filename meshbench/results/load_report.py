"""The README's tables of load: the backpressure of an arrival sweep (on the tick clock, or on the wall clock)
and the wall-clock figures per level over the repetitions, with the table helpers the README shares."""

from __future__ import annotations

from typing import Callable

from meshbench.records.model import LevelRecord, Summary, WallSummary
from meshbench.results.markdown import median_range
from meshbench.results.typed import NodeBundle


def level_name(lv: LevelRecord, clock: str) -> str:
    """A level's name in tables: its concurrency, and its arrival rate when sessions arrive over time."""
    unit = "s" if clock == "wall" else "tick"
    if lv.faults:
        return f"{lv.concurrency} · {','.join(lv.faults)}"
    return str(lv.concurrency) if lv.rate is None else f"{lv.concurrency} @ {lv.rate:g}/{unit}"


def row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


# The wall figures of the bundle README, in the order of its table.
WALL_COLUMNS = (
    "tokens/s",
    "decode tok/s",
    "prefill tok/s",
    "TTFT p50 ms",
    "TTFT p99 ms",
    "queue p50 ms",
    "ITL p50 ms",
    "ITL p99 ms",
    "TPOT p50 ms",
    "TPOT p99 ms",
    "E2E p50 ms",
    "scheduler share",
)


def wall_cells(w: WallSummary) -> list[str]:
    """A level's row of the wall table, in WALL_COLUMNS' order: each figure's median and range at its digits."""

    def at(s: Summary | None, digits: int | None) -> str:
        return median_range(s, _spec(digits), drop_single=True)

    return [
        at(w.tokens_per_s, 1),
        at(w.decode_tokens_per_s, 1),
        at(w.prefill_tokens_per_s, 1),
        at(w.ttft_ms_p50, 2),
        at(w.ttft_ms_p99, 2),
        at(w.queue_ms_p50, 2),
        at(w.itl_ms_p50, 2),
        at(w.itl_ms_p99, 2),
        at(w.tpot_ms_p50, 2),
        at(w.tpot_ms_p99, 2),
        at(w.e2e_ms_p50, 1),
        at(w.scheduler_share, None),
    ]


def _spec(digits: int | None) -> str:
    """A wall column's format: a share in percent, or a number to ``digits`` places."""
    return ".1%" if digits is None else f".{digits}f"


def backpressure_section(b: NodeBundle) -> list[str]:
    if not b.arrival_sweep:
        return []
    slo, clock = b.cfg.slo, b.cfg.clock
    unit = "ms" if b.wall else "ticks"
    bounds = (("TTFT", slo.ttft), ("TPOT", slo.tpot))
    slos = " and ".join(f"{name} <= {bound:g} {unit}" for name, bound in bounds if bound is not None)
    lines = [
        "## Backpressure (deterministic, in ticks)",
        "",
        f"Queue depth {b.results.budget.max_queue_depth}. Goodput counts completed sessions within "
        f"{slos or 'no SLO given: every completed session counts'}. "
        "Rates are per 100 ticks of the level (arrivals, drain and idle ticks included).",
        "",
        "| level | offered | admitted at once | queued | rejected | completed | queue depth max / mean | "
        "queue wait p50 / p95 / max | TTFT p50 / p95 / p99 | accepted /100t | rejected /100t | goodput /100t |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for lv in b.levels:
        bp = lv.backpressure
        rejected = ", ".join(f"{n} {r.removeprefix('REJECTED_').lower()}" for r, n in bp.rejected_by_reason.items())
        lines.append(
            row(
                [
                    level_name(lv, clock),
                    str(bp.offered),
                    str(bp.admitted_at_once),
                    str(bp.queued),
                    rejected or "0",
                    str(bp.completed),
                    f"{bp.queue_depth_max} / {bp.queue_depth_mean:.2f}",
                    _spread(bp.queue_wait_ticks, ("p50", "p95", "max"), _ticks),
                    _spread(bp.ttft_ticks, ("p50", "p95", "p99"), _ticks),
                    f"{bp.accepted_per_100_ticks:.1f}",
                    f"{bp.rejected_per_100_ticks:.1f}",
                    f"{bp.goodput_per_100_ticks:.1f}",
                ]
            )
        )
    unit = "s" if b.wall else "tick"
    sat = ", ".join(
        f"concurrency {c}: {'none up to the highest rate' if r is None else f'{r:g} sessions/{unit}'}"
        for c, r in (b.results.saturation_rates or {}).items()
    )
    lines += ["", f"First rate at which a full queue refused a session (REJECTED_QUEUE_FULL): {sat}.", ""]
    if b.wall:
        lines += _wall_backpressure(b)
    return lines


def _spread(p: dict[str, float | None] | None, qs: tuple[str, ...], fmt: Callable[[float | None], str]) -> str:
    """Percentiles as one cell: ``p50 / p95 / ...``."""
    return " / ".join(fmt((p or {}).get(q)) for q in qs)


def _wall_backpressure(b: NodeBundle) -> list[str]:
    lines = [
        "On the wall clock (rates per second; admission depends on this machine's speed, so these figures and "
        "the tick table above are reported, not reproduced by `--rerun`; the first repetition's stamps, waits "
        "and TTFT from each session's arrival time; goodput within the SLO in ms):",
        "",
        "| level | offered /s | accepted /s | rejected /s | completed /s | queue wait p50 / p95 ms | "
        "TTFT p50 / p95 / p99 ms | goodput /s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for lv in b.levels:
        bp = lv.backpressure
        lines.append(
            row(
                [
                    level_name(lv, "wall"),
                    _rate(bp.offered_per_s),
                    _rate(bp.accepted_per_s),
                    _rate(bp.rejected_per_s),
                    _rate(bp.completed_per_s),
                    _spread(bp.queue_wait_ms, ("p50", "p95"), _ms),
                    _spread(bp.ttft_from_arrival_ms, ("p50", "p95", "p99"), _ms),
                    _rate(bp.goodput_per_s),
                ]
            )
        )
    return [*lines, ""]


def _rate(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def _ticks(x: float | None) -> str:
    return "-" if x is None else f"{x:g}"


def wall_section(b: NodeBundle) -> list[str]:
    repeat, warmup = b.cfg.repeat, b.cfg.warmup
    lines = [
        "## Wall clock (this machine: reported; `meshbench compare` judges it)",
        "",
        f"{repeat} recorded repetition(s) per level after {warmup} warm-up pass(es), interleaved (the level order "
        "rotates each repetition). Each cell is the median over the repetitions"
        + (", with the min-max range." if repeat > 1 else "."),
        "",
        row(["concurrency", *WALL_COLUMNS]),
        "|" + "---|" * (len(WALL_COLUMNS) + 1),
    ]
    for lv in b.levels:
        lines.append(row([str(lv.concurrency), *wall_cells(lv.wall)]))
    return [
        *lines,
        "",
        "decode (prefill) tok/s: decode (prompt) tokens / summed engine time of the decode (prefill) calls, as "
        "llama-batched-bench's S_TG (S_PP); tokens/s: all tokens / wall time. TTFT and E2E count from "
        "submission, queue time from submission to a slot; ITL pools every gap between consecutive tokens; "
        "TPOT is each session's mean gap after its first token, then a percentile over sessions. Scheduler "
        "share: tick time outside engine calls.",
        "",
    ]
