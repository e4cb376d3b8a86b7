"""Why did two levels' tokens differ? Engine batch variance, or contamination between sessions.

The perturbation passes (meshbench.analysis.isolation) decide it for any engine and architecture: under proven
isolation a cross-level divergence can only come from the engine's shape-dependent numerics. Where the
model is one the synthetic engine can run (a llama-architecture make-tiny model, synthetic prompts), the
numpy oracle is consulted too, as an extra check, never as the only one.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

from meshbench.analysis.figures import NEAR_TIE
from meshbench.errors import MeshbenchError
from meshbench.workload.config import RunConfig


def classify(cfg: RunConfig, data: dict, run_sweep: Callable[[RunConfig], dict]) -> str:
    """The divergence's class from the sweep's own isolation verdict, plus the oracle where it applies."""
    div, iso = data["first_divergence"], data["isolation"]
    margin = div.get("reference_margin")
    where = (
        f"session {div['session_id']} token {div['token_index']} at level {div['concurrency']}, "
        f"reference margin {margin if margin is None else f'{margin:.3g}'}"
    )
    if iso["holds"] is False:
        base = (
            f"contamination between sessions: perturbation showed outputs depending on other sessions' "
            f"content (see the levels' isolation verdicts); {where}"
        )
    elif iso["holds"] and iso["every_level"]:
        tie = " (a near-tie)" if margin is not None and margin < NEAR_TIE else ""
        base = (
            f"engine batch variance (shape-dependent numerics): isolation proven by perturbation at every "
            f"level, so the output depends on the batch's shape, never on the other sessions' content; "
            f"{where}{tie}"
        )
    else:
        base = f"unclassified: isolation was not proven at every level; {where}"
    return f"{base}; numpy oracle: {_oracle(cfg, div, data, run_sweep)}"


def _oracle(cfg: RunConfig, div: dict, data: dict, run_sweep: Callable[[RunConfig], dict]) -> str:
    """Rerun the two diverging levels on the synthetic engine over the same weights (exactly order-independent)."""
    arch = data["engine"].get("architecture")
    if arch != "llama" or cfg.workload.prompts is not None or cfg.workload.eos != "continue":
        return (
            f"not applicable (it runs llama-architecture weights on synthetic prompts with eos continue; "
            f"this is {arch!r}"
            + (", real prompts" if cfg.workload.prompts else "")
            + (f", eos {cfg.workload.eos}" if cfg.workload.eos != "continue" else "")
            + ")"
        )
    levels = sorted({div["reference_concurrency"], div["concurrency"]})
    try:
        # the same weights in numpy: llama.cpp's own settings (repacking, tiled matmul, RPC) do not apply there
        engine = dataclasses.replace(
            cfg.engine,
            kind="synthetic",
            repack=False,
            tiled_mm="auto",
            mixed_batch=False,
            rpc=None,
            workers=0,
            split=None,
            package=None,
        )
        other = run_sweep(dataclasses.replace(cfg, levels=tuple(levels), isolation=False, engine=engine))
    except MeshbenchError as e:
        return f"could not run these weights ({e})"
    if other["batch_invariant"]:
        return f"agrees across levels {levels} on the same weights"
    return f"diverges across levels {levels} on the same weights too: the scheduler, not the kernels"
