"""Why did two levels' tokens differ? Kernel batch variance or scheduler corruption.

Orchestration, not engine code: it reruns the diverging levels on the synthetic engine
over the same weights, whose batched decode is exactly order-independent.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

from meshbench.config import RunConfig
from meshbench.errors import MeshbenchError

# A top-1 minus top-2 logit margin below this is a near-tie that kernel rounding can flip.
NEAR_TIE = 0.05


def classify(cfg: RunConfig, divergence: dict, run_sweep: Callable[[RunConfig], dict]) -> str:
    """Rerun the two diverging levels on the synthetic engine (with ``run_sweep``) and read its verdict."""
    levels = sorted({divergence["reference_concurrency"], divergence["concurrency"]})
    synthetic = dataclasses.replace(cfg, levels=tuple(levels), engine=dataclasses.replace(cfg.engine, kind="synthetic"))
    try:
        other = run_sweep(synthetic)
    except MeshbenchError as e:
        return f"unclassified: the synthetic engine could not run these weights ({e})"
    margin = divergence.get("reference_margin")
    if other["corruption_free"] and margin is not None and margin < NEAR_TIE:
        return (f"kernel batch variance: the synthetic engine on the same weights agrees across levels {levels} "
                f"and the reference margin {margin:.3g} is below {NEAR_TIE}")
    if other["corruption_free"]:
        return (f"suspect: the synthetic engine agrees across levels {levels} but the reference margin "
                f"{margin} is not a near-tie")
    return f"scheduler corruption: the synthetic engine on the same weights diverges across levels {levels} too"
