"""The passes that judge a sweep, run here and handed to ``meshbench.analysis``, which only judges them: each
level's isolation passes (the separating family, then single-suspect confirmations), and the numpy oracle's
sweep of two diverging levels."""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

from meshbench.analysis import isolation
from meshbench.analysis.figures import deterministic_ticks
from meshbench.engine import kinds
from meshbench.engine import spec as spec_mod
from meshbench.engine.setup import EngineRecord
from meshbench.engine.spec import EngineSpec
from meshbench.errors import MeshbenchError
from meshbench.records.context import GgufEngineInfo
from meshbench.records.documents import FirstDivergence, NodeResults
from meshbench.records.model import IsolationPass, IsolationRecords
from meshbench.records.turns import by_turn
from meshbench.scheduler.session import GenerationRequest
from meshbench.sweep.passes import Pass
from meshbench.workload.config import RunConfig


def isolation_passes(
    run: Callable[[Sequence[GenerationRequest]], Pass],
    requests: Sequence[GenerationRequest],
    baseline: Pass,
    vocab_size: int,
    seed: int,
    rounds: int = 1,
    groups: isolation.Groups | None = None,
    shared: int = 0,
    family: str = isolation.CONSTANT_WEIGHT,
) -> IsolationRecords:
    """The level's perturbation passes: the separating family ``family`` testing every pair ``rounds`` times,
    then single-suspect passes for each suspect of a session that changed. ``run(requests)`` runs one pass of
    the level; ``baseline`` is the level's own first pass; ``groups``: the shared prefixes (of ``shared``
    tokens), perturbed as units."""
    ids = [r.session_id for r in requests]
    turn_records = by_turn(baseline.sessions)  # each (session, turn)'s record
    passes: list[IsolationPass] = []

    def one(perturbed: list[str], confirm: bool) -> IsolationPass:
        reqs = isolation.requests_for(requests, perturbed, turn_records, vocab_size, seed, len(passes), groups, shared)
        p = run(reqs)
        passes.append(isolation.pass_record(perturbed, deterministic_ticks(p.ticks), p.sessions, confirm))
        return passes[-1]

    family_passes = [one(sets, False) for sets in isolation.family_sets(ids, rounds, groups, family)]
    for j, victims in isolation.culprits(baseline.sessions, family_passes, ids, groups).items():
        for _ in range(isolation.CONFIRM_TRIES):
            if victims & set(isolation.changed(baseline.sessions, one([j], True), groups)):
                break
    return IsolationRecords(sessions=ids, passes=passes, reason=None, groups=groups)


def isolation_record(
    baseline: Pass,
    run: Callable[[Sequence[GenerationRequest]], Pass],
    requests: Sequence[GenerationRequest],
    vocab: int,
    seed: int,
    skipped: str | None,
    rounds: int = 1,
    groups: isolation.Groups | None = None,
    shared: int = 0,
    family: str = isolation.CONSTANT_WEIGHT,
) -> IsolationRecords:
    """The level's isolation records: its perturbation passes, or why there are none (``level_record`` judges
    them against the level's own first pass ``baseline``)."""
    if skipped is not None:
        return IsolationRecords(sessions=None, passes=None, reason=skipped)
    return isolation_passes(run, requests, baseline, vocab, seed, rounds, groups, shared, family)


def as_synthetic(engine: EngineSpec) -> EngineSpec:
    """The same weights in numpy: every setting the synthetic engine has not (llama.cpp's repacking, tiled matmul,
    micro-batch, RPC, a package) at its default, whichever settings a later meshbench adds."""
    theirs = [f for f in spec_mod.settings() if kinds.SYNTHETIC.name not in f.metadata["kinds"]]
    return dataclasses.replace(engine, kind=kinds.SYNTHETIC.name, **{f.name: f.default for f in theirs})


def oracle(
    cfg: RunConfig, div: FirstDivergence, engine_info: EngineRecord, run_sweep: Callable[[RunConfig], NodeResults]
) -> str:
    """Rerun the two diverging levels on the synthetic engine over the same weights (exactly order-independent)."""
    arch = engine_info.architecture if isinstance(engine_info, GgufEngineInfo) else None
    if arch != "llama" or cfg.workload.prompts is not None or cfg.workload.eos != "continue":
        return (
            f"not applicable (it runs llama-architecture weights on synthetic prompts with eos continue; "
            f"this is {arch!r}"
            + (", real prompts" if cfg.workload.prompts else "")
            + (f", eos {cfg.workload.eos}" if cfg.workload.eos != "continue" else "")
            + ")"
        )
    levels = sorted({div.reference_concurrency, div.concurrency})
    try:
        engine = as_synthetic(cfg.engine)
        other = run_sweep(dataclasses.replace(cfg, levels=tuple(levels), isolation=False, engine=engine))
    except MeshbenchError as e:
        return f"could not run these weights ({e})"
    if other.batch_invariant:
        return f"agrees across levels {levels} on the same weights"
    return f"diverges across levels {levels} on the same weights too: the scheduler, not the kernels"
