"""`meshbench admit`: submit a workload (or a burst) to a fresh scheduler and report."""

from __future__ import annotations

from meshbench.config import RunConfig, Workload
from meshbench.engine import factory
from meshbench.engine.base import check_context
from meshbench.scheduler.scheduler import ContinuousBatchScheduler


def run(cfg: RunConfig, burst: int | None = None) -> dict:
    budget = cfg.budget
    wl = cfg.workload
    if burst is not None:
        wl = Workload((wl.prompt_tokens[0],) * burst, (wl.new_tokens[0],) * burst, wl.seed)
    setup = factory.setup(cfg.engine, wl.longest, budget.max_active_sessions)
    check_context(wl.longest, setup.context_length)  # one rule for admit and sweep
    sched = ContinuousBatchScheduler(setup.make(budget), budget)
    decisions = [sched.submit(r).to_dict() for r in wl.requests(setup.vocab_size)]
    return {
        "engine": {k: setup.info[k] for k in ("kind", "kv_bytes_per_token", "weight_bytes",
                                               "scratch_bytes_per_session")},
        "budget": budget.to_dict(),
        "effective_active_cap": sched.active_cap,
        "decisions": decisions,
        "summary": {reason: sum(d["reason"] == reason for d in decisions)
                    for reason in sorted({d["reason"] for d in decisions})},
        "telemetry": sched.telemetry().to_dict(),
    }
