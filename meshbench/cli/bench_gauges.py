"""``meshbench bench gauges``: what sampling the server's gauges during a pass costs it."""

from __future__ import annotations

import dataclasses
from typing import Annotated

import typer

from meshbench.bench import gauge_cost
from meshbench.cli.bench import bench_app
from meshbench.cli.common import ConfigOpt, JsonOpt, err, int_list, out, print_json, table
from meshbench.cli.options import flag
from meshbench.results.markdown import median_range
from meshbench.workload import config


@bench_app.command("gauges")
def bench_gauges(
    config_path: ConfigOpt = None,
    levels: Annotated[str, flag("--levels", help="Closed-loop clients per level, e.g. 1,4,16.")] = "1,4,16",
    pairs: Annotated[
        int, typer.Option("--pairs", min=2, max=100, help="Pairs of passes per level (each side first in half).")
    ] = 8,
    as_json: JsonOpt = False,
) -> None:
    """Passes with and without the gauge sampler (engine.gauges), in interleaved pairs on one llama-server started
    as the endpoint config says (native API, eos banned): tokens/s and ITL p99, sampled / unsampled per pair."""
    cfg = config.load(config_path, {})
    gauge_cost.check(cfg)
    chosen = int_list(levels, "--levels", unique=True, maximum=cfg.workload.sessions)
    res = gauge_cost.run(cfg, chosen, pairs, progress=lambda m: err.print(m, markup=False))
    if as_json:
        print_json(dataclasses.asdict(res))
        return
    t = table(
        f"the gauge sampler's cost: {pairs} pairs per level, every {res.interval_s:g} s, medians",
        ("C", "figure", "sampled", "unsampled", "sampled / unsampled, per pair: median (min-max)"),
    )
    for lv in res.levels:
        for v, name in ((lv.tokens_per_s, "tokens/s"), (lv.itl_p99_ms, "ITL p99 ms")):
            spread = "-" if v.ratio is None else median_range(v.ratio, ".3f")
            t.add_row(str(lv.concurrency), name, _cell(v.sampled), _cell(v.unsampled), spread)
        t.add_row(str(lv.concurrency), "samples per sampled pass", f"{lv.samples_per_pass:g}", "", "")
    out.print(t)


def _cell(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"
