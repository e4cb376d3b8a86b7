"""The README's tables of load: the backpressure of an arrival sweep (on the tick clock, or on the wall clock)
and the wall-clock figures per level over the repetitions, with the table helpers the README shares."""

from __future__ import annotations

from meshbench.results.markdown import median_range


def level_name(lv: dict, clock: str) -> str:
    """A level's name in tables: its concurrency, and its arrival rate when sessions arrive over time."""
    unit = "s" if clock == "wall" else "tick"
    if lv["faults"]:
        return f"{lv['concurrency']} · {','.join(lv['faults'])}"
    return str(lv["concurrency"]) if lv["rate"] is None else f"{lv['concurrency']} @ {lv['rate']:g}/{unit}"


def arrival_sweep(results: dict) -> bool:
    """Sessions arrive over time (a process, or rates), rather than all before the first tick."""
    return any(lv["arrivals"] != "all-at-once" for lv in results["levels"])


def row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def ms_cell(p: dict, key: str) -> str:
    v = p.get(key)
    return "-" if v is None else f"{v:.2f}"


# The wall figures of the bundle README, in the order of its table.
WALL_COLUMNS = (
    ("tokens_per_s", "tokens/s", 1),
    ("decode_tokens_per_s", "decode tok/s", 1),
    ("prefill_tokens_per_s", "prefill tok/s", 1),
    ("ttft_ms.p50", "TTFT p50 ms", 2),
    ("ttft_ms.p99", "TTFT p99 ms", 2),
    ("queue_ms.p50", "queue p50 ms", 2),
    ("itl_ms.p50", "ITL p50 ms", 2),
    ("itl_ms.p99", "ITL p99 ms", 2),
    ("tpot_ms.p50", "TPOT p50 ms", 2),
    ("tpot_ms.p99", "TPOT p99 ms", 2),
    ("e2e_ms.p50", "E2E p50 ms", 1),
    ("scheduler_share", "scheduler share", None),
)


def _spec(digits: int | None) -> str:
    """A wall column's format: a share in percent, or a number to ``digits`` places."""
    return ".1%" if digits is None else f".{digits}f"


def backpressure_section(results: dict) -> list[str]:
    if not arrival_sweep(results):
        return []
    slo = results["config"]["slo"]
    unit = "ms" if results["config"]["clock"] == "wall" else "ticks"
    slos = [
        f"TTFT <= {slo['ttft']:g} {unit}" if slo["ttft"] is not None else "",
        f"TPOT <= {slo['tpot']:g} {unit}" if slo["tpot"] is not None else "",
    ]
    slos = " and ".join(x for x in slos if x) or "no SLO given: every completed session counts"
    lines = [
        "## Backpressure (deterministic, in ticks)",
        "",
        f"Queue depth {results['budget']['max_queue_depth']}. Goodput counts completed sessions within {slos}. "
        "Rates are per 100 ticks of the level (arrivals, drain and idle ticks included).",
        "",
        "| level | offered | admitted at once | queued | rejected | completed | queue depth max / mean | "
        "queue wait p50 / p95 / max | TTFT p50 / p95 / p99 | accepted /100t | rejected /100t | goodput /100t |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for lv in results["levels"]:
        b = lv["backpressure"]
        rejected = ", ".join(f"{n} {r.removeprefix('REJECTED_').lower()}" for r, n in b["rejected_by_reason"].items())
        w, t = b["queue_wait_ticks"], b["ttft_ticks"]
        lines.append(
            row(
                [
                    level_name(lv, results["config"]["clock"]),
                    str(b["offered"]),
                    str(b["admitted_at_once"]),
                    str(b["queued"]),
                    rejected or "0",
                    str(b["completed"]),
                    f"{b['queue_depth_max']} / {b['queue_depth_mean']:.2f}",
                    " / ".join(_ticks(w[k]) for k in ("p50", "p95", "max")),
                    " / ".join(_ticks(t[k]) for k in ("p50", "p95", "p99")),
                    f"{b['accepted_per_100_ticks']:.1f}",
                    f"{b['rejected_per_100_ticks']:.1f}",
                    f"{b['goodput_per_100_ticks']:.1f}",
                ]
            )
        )
    unit = "s" if results["config"]["clock"] == "wall" else "tick"
    sat = ", ".join(
        f"concurrency {c}: {'none up to the highest rate' if r is None else f'{r:g} sessions/{unit}'}"
        for c, r in results["saturation_rates"].items()
    )
    lines += ["", f"First rate at which a full queue refused a session (REJECTED_QUEUE_FULL): {sat}.", ""]
    if results["config"]["clock"] == "wall":
        lines += _wall_backpressure(results)
    return lines


def _wall_backpressure(results: dict) -> list[str]:
    lines = [
        "On the wall clock (rates per second; admission depends on this machine's speed, so these figures and "
        "the tick table above are reported, not reproduced by `--rerun`; the first repetition's stamps, waits "
        "and TTFT from each session's arrival time; goodput within the SLO in ms):",
        "",
        "| level | offered /s | accepted /s | rejected /s | completed /s | queue wait p50 / p95 ms | "
        "TTFT p50 / p95 / p99 ms | goodput /s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for lv in results["levels"]:
        b = lv["backpressure"]
        w, t = b["queue_wait_ms"], b["ttft_from_arrival_ms"]
        lines.append(
            row(
                [
                    level_name(lv, "wall"),
                    f"{b['offered_per_s']:.1f}",
                    f"{b['accepted_per_s']:.1f}",
                    f"{b['rejected_per_s']:.1f}",
                    f"{b['completed_per_s']:.1f}",
                    " / ".join(ms_cell(w, k) for k in ("p50", "p95")),
                    " / ".join(ms_cell(t, k) for k in ("p50", "p95", "p99")),
                    f"{b['goodput_per_s']:.1f}",
                ]
            )
        )
    return [*lines, ""]


def _ticks(x) -> str:
    return "-" if x is None else f"{x:g}"


def wall_section(results: dict) -> list[str]:
    repeat, warmup = results["config"]["repeat"], results["config"]["warmup"]
    lines = [
        "## Wall clock (this machine: reported; `meshbench compare` judges it)",
        "",
        f"{repeat} recorded repetition(s) per level after {warmup} warm-up pass(es), interleaved (the level order "
        "rotates each repetition). Each cell is the median over the repetitions"
        + (", with the min-max range." if repeat > 1 else "."),
        "",
        row(["concurrency", *[name for _, name, _ in WALL_COLUMNS]]),
        "|" + "---|" * (len(WALL_COLUMNS) + 1),
    ]
    for lv in results["levels"]:
        cells = [median_range(lv["wall"].get(k), _spec(d), drop_single=True) for k, _, d in WALL_COLUMNS]
        lines.append(row([str(lv["concurrency"]), *cells]))
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
