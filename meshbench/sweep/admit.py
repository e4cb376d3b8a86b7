"""`meshbench admit`: submit a workload (or a burst) to a fresh scheduler and report every decision.

With every session at once, the sessions are submitted and no tick runs. With arrivals over
time, the node runs: each session is submitted before its arrival tick, and each decision is
reported with its tick (the timeline), as the sweep records it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from meshbench.engine import factory, kinds
from meshbench.engine.base import check_context
from meshbench.engine.setup import EngineSizing, close_engine
from meshbench.errors import MeshbenchError
from meshbench.records.context import Budget
from meshbench.scheduler.budget import AdmissionDecision, engine_limits
from meshbench.scheduler.plan import bursts
from meshbench.scheduler.telemetry import SchedulerTelemetry
from meshbench.sweep.driver import NodeDriver
from meshbench.sweep.run import node
from meshbench.workload import arrivals, prompts
from meshbench.workload.config import RunConfig
from meshbench.workload.workload import Workload


@dataclass(frozen=True, slots=True)
class Decided:
    """One admission decision, and the tick before which the session was submitted (0: all at once)."""

    tick: int
    decision: AdmissionDecision


@dataclass(frozen=True, slots=True)
class AdmitEngine:
    """What admission reads of the engine's record."""

    kind: str
    kv_bytes_per_token: int
    weight_bytes: int
    scratch_bytes_per_session: int


@dataclass(frozen=True, slots=True)
class Admission:
    """``meshbench admit``'s report: every decision in order, with the node's budget and telemetry."""

    engine: AdmitEngine
    budget: Budget
    effective_active_cap: int
    arrivals: str
    ticks: int
    decisions: list[Decided]
    telemetry: SchedulerTelemetry

    def summary(self) -> dict[str, int]:
        """Decisions by reason, the reasons in order of their names."""
        reasons = [d.decision.reason.value for d in self.decisions]
        return {r: reasons.count(r) for r in sorted(set(reasons))}

    def to_json(self) -> dict[str, Any]:
        """--json: each decision with its tick, a summary by reason."""
        return {
            "engine": dataclasses.asdict(self.engine),
            "budget": dataclasses.asdict(self.budget),
            "effective_active_cap": self.effective_active_cap,
            "arrivals": self.arrivals,
            "ticks": self.ticks,
            "decisions": [dict(d.decision.to_dict(), tick=d.tick) for d in self.decisions],
            "summary": self.summary(),
            "telemetry": self.telemetry.to_dict(),
        }


def run(cfg: RunConfig, burst: int | None = None) -> Admission:
    """On the node the config describes (its RPC workers too, started and stopped around the run)."""
    if not kinds.of(cfg.engine.kind).own:  # (admission is a meshbench node's)
        raise MeshbenchError(
            "admit runs meshbench's own node's admission; a served endpoint admits by its own rules "
            "(sweep --target measures it)"
        )
    cfg = prompts.apply(cfg)
    with node(cfg) as on:
        return _run(cfg, burst, on.endpoints)


def _run(cfg: RunConfig, burst: int | None, endpoints) -> Admission:
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


def _decide(cfg: RunConfig, wl: Workload, process, setup) -> Admission:
    budget = cfg.budget
    check_context(wl.longest, setup.context_length)  # one rule for admit and sweep
    engine = setup.make(engine_limits(budget))
    try:
        return _report(setup, budget, process, wl, NodeDriver(engine, budget, prefill_policy=cfg.prefill))
    finally:
        close_engine(engine)


def _report(setup, budget: Budget, process, wl: Workload, node: NodeDriver) -> Admission:
    requests = wl.requests(setup.vocab_size)
    if process.all_at_once:
        decisions = [Decided(0, node.submit(r)) for r in requests]
    else:
        decisions = []
        schedule = list(zip(process.ticks(wl.sessions, wl.seed), requests))
        node.run_to_completion(
            arrivals=schedule, on_submit=lambda tick, d, _at, _now: decisions.append(Decided(tick, d))
        )
    e = setup.info
    return Admission(
        engine=AdmitEngine(e.kind, e.kv_bytes_per_token, e.weight_bytes, e.scratch_bytes_per_session),
        budget=budget,
        effective_active_cap=node.sched.active_cap,
        arrivals=process.label(),
        ticks=len(node.ticks()),
        decisions=decisions,
        telemetry=node.telemetry(),
    )
