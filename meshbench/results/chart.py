"""The bundle's chart.png: the scheduler's curves and the latency/throughput curve (needs matplotlib)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from meshbench.records.model import LevelRecord
from meshbench.results.typed import NodeBundle


def write(b: NodeBundle, path: Path) -> bool:
    """Four panels against concurrency and throughput; False when matplotlib is absent."""
    try:
        import matplotlib  # noqa: PLC0415 - optional extra

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415
    except ImportError:
        return False
    r = b.results
    if any(lv.faults for lv in b.levels):
        return False  # a fault matrix is a table (README), not a curve
    fig = _backpressure(plt, b) if r.reference is not None else _concurrency(plt, b.levels)
    fig.suptitle(
        f"{r.story}: {r.engine.kind} engine"
        + (f", saturation at {r.saturation_concurrency}" if r.reference is None else "")
    )
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def _backpressure(plt: Any, b: NodeBundle) -> Any:
    """The backpressure curve, per concurrency: offered against accepted, rejected and goodput; queue wait."""
    fig, ax = plt.subplots(1, 2, figsize=(10, 4))
    for c in sorted({lv.concurrency for lv in b.levels}):
        levels = sorted((lv for lv in b.levels if lv.concurrency == c), key=lambda lv: lv.rate or 0.0)
        rate = [lv.rate for lv in levels]
        bp = [lv.backpressure for lv in levels]
        ax[0].plot(rate, [x.offered_per_100_ticks for x in bp], "k:", label=f"c={c} offered")
        ax[0].plot(rate, [x.accepted_per_100_ticks for x in bp], "o-", label=f"c={c} accepted")
        ticks = [lv.ticks for lv in levels]
        for reason in sorted({r for x in bp for r in x.rejected_by_reason}):
            ax[0].plot(
                rate,
                [100.0 * x.rejected_by_reason.get(reason, 0) / n for x, n in zip(bp, ticks)],
                "x--",
                label=f"c={c} {reason.removeprefix('REJECTED_').lower()}",
            )
        ax[0].plot(rate, [x.goodput_per_100_ticks for x in bp], "s-", label=f"c={c} goodput")
        for q, style in (("p95", "o-"), ("p50", "s--")):
            ax[1].plot(rate, [x.queue_wait_ticks.get(q) or 0 for x in bp], style, label=f"c={c} {q}")
    # The curve is drawn in ticks on both clocks (the tick figures are always there).
    ax[0].set_title("sessions per 100 ticks against the offered rate")
    ax[1].set_title("queue wait (ticks) against the offered rate")
    for a in ax:
        a.set_xlabel(f"offered rate (sessions per {'second' if b.wall else 'tick'})")
        a.set_xscale("log")
        a.grid(alpha=0.3)
        a.legend(fontsize=7)
    return fig


def _concurrency(plt: Any, levels: list[LevelRecord]) -> Any:
    c = [lv.concurrency for lv in levels]
    decode = [lv.wall.decode_tokens_per_s for lv in levels]
    fig, ax = plt.subplots(2, 2, figsize=(10, 7))
    ax[0, 0].plot(c, [lv.avg_batch_occupancy for lv in levels], "o-", label="average")
    ax[0, 0].plot(c, [lv.max_batch_occupancy for lv in levels], "s--", label="max")
    ax[0, 0].set_title("decode batch occupancy")
    ax[0, 0].legend()
    ax[0, 1].plot(c, [lv.tokens_per_tick for lv in levels], "o-")
    ax[0, 1].set_title("tokens per tick")
    med = [d.median for d in decode]
    ax[1, 0].errorbar(
        c,
        med,
        yerr=[[m - d.min for m, d in zip(med, decode)], [d.max - m for m, d in zip(med, decode)]],
        fmt="o-",
        capsize=3,
    )
    ax[1, 0].set_title("decode tokens/s (median, min-max over repetitions)")
    for a in (ax[0, 0], ax[0, 1], ax[1, 0]):
        a.set_xlabel("concurrency")
        a.set_xscale("log", base=2)
        a.set_xticks(c, [str(x) for x in c])
    for q, style, itl in (("p50", "o-", [lv.wall.itl_ms_p50 for lv in levels]),
                          ("p99", "s--", [lv.wall.itl_ms_p99 for lv in levels])):  # fmt: skip
        points = [(m, i.median) for m, i in zip(med, itl) if i is not None]
        if points:
            ax[1, 1].plot(*zip(*points), style, label=f"ITL {q}")
    ax[1, 1].set_xlabel("decode tokens/s")
    ax[1, 1].set_ylabel("ms")
    ax[1, 1].set_title("latency against throughput (one point per level)")
    if ax[1, 1].lines:
        ax[1, 1].legend()
    for a in ax.flat:
        a.grid(alpha=0.3)
    return fig
