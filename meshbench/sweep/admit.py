"""`meshbench admit`: submit a workload (or a burst) to a fresh scheduler and report every decision.

With every session at once, the sessions are submitted and no tick runs. With arrivals over
time, the node runs: each session is submitted before its arrival tick, and each decision is
reported with its tick (the timeline), as the sweep records it.
"""

from __future__ import annotations

from meshbench.engine import factory, kinds
from meshbench.engine.base import check_context
from meshbench.engine.setup import EngineSizing, close_engine
from meshbench.errors import MeshbenchError
from meshbench.scheduler.plan import bursts
from meshbench.sweep.driver import NodeDriver
from meshbench.sweep.run import node
from meshbench.workload import arrivals, prompts
from meshbench.workload.config import RunConfig
from meshbench.workload.workload import Workload


def run(cfg: RunConfig, burst: int | None = None) -> dict:
    """On the node the config describes (its RPC workers too, started and stopped around the run)."""
    if not kinds.of(cfg.engine.kind).own:  # (admission is a meshbench node's)
        raise MeshbenchError(
            "admit runs meshbench's own node's admission; a served endpoint admits by its own rules "
            "(sweep --target measures it)"
        )
    cfg = prompts.apply(cfg)
    with node(cfg) as on:
        return _run(cfg, burst, on.endpoints)


def _run(cfg: RunConfig, burst: int | None, endpoints) -> dict:
    budget = cfg.budget
    wl = cfg.workload
    if burst is not None:
        wl = Workload((wl.prompt_tokens[0],) * burst, (wl.new_tokens[0],) * burst, wl.seed, wl.arrivals)
    process = arrivals.parse(wl.arrivals)
    setup = factory.setup(
        cfg.engine,
        EngineSizing(wl.longest, budget.max_active_sessions, wl.longest_prompt, burst=bursts(cfg.prefill)),
        endpoints=endpoints,
    )
    try:
        return _decide(cfg, wl, process, setup)
    finally:
        setup.close()  # while the workers still serve its buffers


def _decide(cfg: RunConfig, wl: Workload, process, setup) -> dict:
    budget = cfg.budget
    check_context(wl.longest, setup.context_length)  # one rule for admit and sweep
    engine = setup.make(budget.engine_limits())
    try:
        return _report(setup, budget, process, wl, NodeDriver(engine, budget, prefill_policy=cfg.prefill))
    finally:
        close_engine(engine)


def _report(setup, budget, process, wl: Workload, node: NodeDriver) -> dict:
    requests = wl.requests(setup.vocab_size)
    if process.all_at_once:
        decisions = [dict(node.submit(r).to_dict(), tick=0) for r in requests]
    else:
        decisions = []
        schedule = list(zip(process.ticks(wl.sessions, wl.seed), requests))
        node.run_to_completion(
            arrivals=schedule, on_submit=lambda tick, d, _at, _now: decisions.append(dict(d.to_dict(), tick=tick))
        )
    return {
        "engine": {
            "kind": setup.info.kind,
            "kv_bytes_per_token": setup.info.kv_bytes_per_token,
            "weight_bytes": setup.info.weight_bytes,
            "scratch_bytes_per_session": setup.info.scratch_bytes_per_session,
        },
        "budget": budget.to_dict(),
        "effective_active_cap": node.sched.active_cap,
        "arrivals": process.label(),
        "ticks": len(node.ticks()),
        "decisions": decisions,
        "summary": {
            reason: sum(d["reason"] == reason for d in decisions) for reason in sorted({d["reason"] for d in decisions})
        },
        "telemetry": node.telemetry().to_dict(),
    }
