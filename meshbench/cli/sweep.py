"""``meshbench sweep``: the same sessions at every concurrency level, and the evidence that batching
never mixed them."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import typer

from meshbench.cli import options, options_engine, progress, sweep_matrix
from meshbench.cli.common import (
    command_line,
    err,
    out,
    print_json,
    table,
)
from meshbench.endpoint import sweep as endpoint_sweep
from meshbench.errors import MeshbenchError
from meshbench.records import serial
from meshbench.records.documents import EndpointResults, NodeResults
from meshbench.records.model import Summary
from meshbench.results import bundle, envinfo, kinds, report
from meshbench.results.endpoint_report import cell
from meshbench.results.typed import EndpointBundle, NodeBundle
from meshbench.sweep import run
from meshbench.verify import bundle as verify_mod
from meshbench.workload import config as config_mod

SWEEP_OPTIONS = (
    "config",
    "levels",
    *(o.name for o in options_engine.ENGINE),  # every engine option (meshbench.engine.spec)
    "prefill",
    "eos",
    "isolation",
    "isolation_rounds",
    "isolation_family",
    "inject",
    "restart_engine",
    "sessions",
    "prompt_tokens",
    "prefix_groups",
    "prefix_tokens",
    "turns",
    "turn_tokens",
    "cancel",
    "prompts",
    "new_tokens",
    "max_prefill_tokens_per_tick",
    "seed",
    "arrivals",
    "rates",
    "max_queue_depth",
    "slo_ttft",
    "slo_tpot",
    "clock",
    "repeat",
    "warmup",
    "out_dir",
    "force",
    "as_json",
    "verbose",
)


@options.command(SWEEP_OPTIONS)
def sweep(**given: Any) -> None:
    """Run the same sessions at every concurrency level and prove batching never mixes them.

    With no options: the DGR-012 sweep on the synthetic engine (8 sessions, levels 1,2,4,8).
    """
    if given["target"] is not None and given["serve"] is not None:
        raise MeshbenchError("give --target (a server you run) or --serve (one meshbench starts), not both")
    cfg = config_mod.load(given["config"], options.overrides(given))
    _sweep(cfg, given["out_dir"], given["force"], given["as_json"], given["verbose"])


def _sweep(cfg: config_mod.RunConfig, out_dir: Path | None, force: bool, as_json: bool, verbose: bool) -> None:
    if cfg.engine.server_settings:
        sweep_matrix.sweep(cfg, out_dir, force, as_json)
        return
    if out_dir is not None:
        bundle.prepare(out_dir, force)
    kind = kinds.of_engine(cfg.engine.kind)
    record = RUNS[kind](cfg, verbose)
    typed = kinds.KINDS[kind].bundled(record)  # the sweep's own records, read by the bundle, summary and check
    data: dict[str, Any] = serial.to_json(record)  # results.json's text, and --json's
    if out_dir is not None:
        err.print(f"wrote {out_dir}: {', '.join(bundle.commit(out_dir, data, force, typed))}", markup=False)
    if as_json:
        print_json(data)
    else:
        SUMMARIES[kinds.of(data)](typed)
    _check_own_evidence(data, typed)


def _check_own_evidence(data: dict, typed: NodeBundle | EndpointBundle) -> None:
    """A sweep whose evidence would not pass verify says why and exits 1 (its bundle is kept)."""
    typed = verify_mod.VERIFIES[kinds.of(data)].concrete(typed, run.with_prompt_ids)  # (a node's real prompts' ids)
    failures = verify_mod.check_typed(data, typed).failures
    if failures:
        for f in failures:
            err.print(f"sweep: {f}", markup=False)
        err.print(f"sweep: the evidence fails {len(failures)} checks that verify makes", markup=False)
        raise typer.Exit(1)


def _run_with_progress(cfg: config_mod.RunConfig, verbose: bool) -> NodeResults:
    """The node's sweep, with its passes' progress on stderr (meshbench.cli.progress)."""
    with progress.passes("sweep") as (on_tick, on_pass):
        return run.sweep_on_node(cfg, command_line(), on_tick, verbose, on_pass)


def _print_sweep(b: NodeBundle) -> None:
    r, levels = b.results, b.levels
    t = table(
        f"{r.story}: {r.engine.kind} engine, {r.workload.sessions} sessions, {b.cfg.repeat} repetition(s): medians",
        ("level", "ticks", "avg occ", "max occ", "tok/tick", "peak KV B", "tok/s", "decode tok/s", "ITL p50 ms"),
    )
    for row, lv in zip(report.table_rows(b), levels):
        w = lv.wall
        t.add_row(
            *row, median_cell(w.tokens_per_s, 1), median_cell(w.decode_tokens_per_s, 1), median_cell(w.itl_ms_p50, 2)
        )
    out.print(t)
    out.print(
        f"corruption_free={r.corruption_free} batch_invariant={r.batch_invariant} "
        f"isolation={r.isolation.holds} ({r.isolation.levels_run} of {len(levels)} "
        f"levels) saturation_concurrency={r.saturation_concurrency} "
        f"cache_misses={sum(lv.cache_misses for lv in levels)} "
        f"rejected_admissions={sum(lv.rejected_admissions for lv in levels)} "
        f"failed={sum(lv.failed for lv in levels)}"
    )
    shared = [lv for lv in levels if lv.prefix is not None and lv.cache_verdict is not None]
    if shared:
        out.print(
            f"prefix cache: cache_equivalence={all(lv.cache_verdict.holds for lv in shared if lv.cache_verdict)} "
            f"hits={sum(lv.prefix.hits for lv in shared if lv.prefix)} "
            f"prefill_saved={sum(lv.prefix.saved_tokens for lv in shared if lv.prefix)} "
            f"prefill_computed={sum(lv.prefix.computed_tokens for lv in shared if lv.prefix)}"
            + (
                f" conversation_misses={sum(lv.prefix.conversation_misses or 0 for lv in shared if lv.prefix)}"
                if any(lv.prefix and lv.prefix.conversation_misses is not None for lv in shared)
                else ""
            )
            + " (all levels)"
        )
    if r.first_divergence:
        out.print(f"first divergence: {serial.to_json(r.first_divergence)}")


def median_cell(s: Summary | None, digits: int) -> str:
    return "-" if s is None else f"{s.median:.{digits}f}"


def _run_endpoint(cfg: config_mod.RunConfig) -> EndpointResults:
    """The endpoint sweep, one progress line per pass on stderr."""
    return endpoint_sweep.run(
        cfg, command_line(), envinfo.environment(), lambda m: err.print(f"sweep: {m}", markup=False)
    )


def _print_endpoint(b: EndpointBundle) -> None:
    r = b.results
    v, e = r.verdicts, r.endpoint
    t = table(
        f"{r.story}: {e.server} at {e.url} ({e.api} API), "
        f"{r.workload.sessions} sessions, {len(r.levels[0].repetitions)} repetition(s): medians",
        (
            "level",
            "differ from C=ref",
            "max distinct",
            "needle distinct",
            "tok/s",
            "TTFT p50 ms",
            "ITL p50 ms",
            "ITL p99 ms",
        ),
    )
    for lv in r.levels:
        c, f = lv.concurrency, lv.figures
        t.add_row(
            str(c),
            str(len(v.differing_sessions[c])),
            str(max(v.distinct_outputs[c].values(), default=0)),
            str(v.needle[c].distinct),
            *(cell(x) for x in (f.tokens_per_s, f.ttft_ms_p50, f.itl_ms_p50, f.itl_ms_p99)),
        )
    out.print(t)
    out.print(
        f"compared={v.compared} batch_invariant={v.batch_invariant} "
        f"run_to_run_deterministic={v.run_to_run_deterministic} needle_stable={v.needle_stable}"
    )


# Each kind of bundle (meshbench.results.kinds): how the CLI runs its sweep, and the summary it prints.
RUNS: dict[str, Callable[[config_mod.RunConfig, bool], NodeResults | EndpointResults]] = {
    kinds.NODE: lambda cfg, verbose: _run_with_progress(cfg, verbose),
    kinds.ENDPOINT: lambda cfg, verbose: _run_endpoint(cfg),
}
SUMMARIES: dict[str, Callable[[Any], None]] = {kinds.NODE: _print_sweep, kinds.ENDPOINT: _print_endpoint}
