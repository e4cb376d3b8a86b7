"""The bundle's chart.png: the scheduler's curves and the latency/throughput curve (needs matplotlib)."""

from __future__ import annotations

from pathlib import Path


def write(data: dict, path: Path) -> bool:
    """Four panels against concurrency and throughput; False when matplotlib is absent."""
    try:
        import matplotlib  # noqa: PLC0415 - optional extra

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415
    except ImportError:
        return False
    levels = data["levels"]
    c = [lv["concurrency"] for lv in levels]
    decode = [lv["wall"]["decode_tokens_per_s"] for lv in levels]
    fig, ax = plt.subplots(2, 2, figsize=(10, 7))
    ax[0, 0].plot(c, [lv["avg_batch_occupancy"] for lv in levels], "o-", label="average")
    ax[0, 0].plot(c, [lv["max_batch_occupancy"] for lv in levels], "s--", label="max")
    ax[0, 0].set_title("decode batch occupancy")
    ax[0, 0].legend()
    ax[0, 1].plot(c, [lv["tokens_per_tick"] for lv in levels], "o-")
    ax[0, 1].set_title("tokens per tick")
    med = [d["median"] for d in decode]
    ax[1, 0].errorbar(c, med, yerr=[[m - d["min"] for m, d in zip(med, decode)],
                                    [d["max"] - m for m, d in zip(med, decode)]], fmt="o-", capsize=3)
    ax[1, 0].set_title("decode tokens/s (median, min-max over repetitions)")
    for a in (ax[0, 0], ax[0, 1], ax[1, 0]):
        a.set_xlabel("concurrency")
        a.set_xscale("log", base=2)
        a.set_xticks(c, [str(x) for x in c])
    for q, style in (("p50", "o-"), ("p99", "s--")):
        itl = [lv["wall"].get(f"itl_ms.{q}") for lv in levels]
        points = [(m, i["median"]) for m, i in zip(med, itl) if i is not None]
        if points:
            ax[1, 1].plot(*zip(*points), style, label=f"ITL {q}")
    ax[1, 1].set_xlabel("decode tokens/s")
    ax[1, 1].set_ylabel("ms")
    ax[1, 1].set_title("latency against throughput (one point per level)")
    if ax[1, 1].lines:
        ax[1, 1].legend()
    for a in ax.flat:
        a.grid(alpha=0.3)
    fig.suptitle(f"{data['story']}: {data['engine']['kind']} engine, saturation at {data['saturation_concurrency']}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True
