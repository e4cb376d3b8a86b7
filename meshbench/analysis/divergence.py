"""Why did two levels' tokens differ? Engine batch variance, or contamination between sessions.

The perturbation passes (meshbench.analysis.isolation) decide it for any engine and architecture: under proven
isolation a cross-level divergence can only come from the engine's shape-dependent numerics. Where the
model is one the synthetic engine can run (a llama-architecture make-tiny model, synthetic prompts), the
numpy oracle is consulted too, as an extra check, never as the only one.
"""

from __future__ import annotations

from meshbench.analysis.figures import NEAR_TIE
from meshbench.records.documents import FirstDivergence, SweepIsolation


def classify(div: FirstDivergence, isolation: SweepIsolation, oracle: str) -> str:
    """The divergence's class from the sweep's own isolation verdict, with the numpy oracle's finding
    (``meshbench.sweep.prove.oracle``, run by the runner). ``div`` is the sweep's first divergence, ``isolation``
    its isolation verdict."""
    iso = isolation
    margin = div.reference_margin
    where = (
        f"session {div.session_id} token {div.token_index} at level {div.concurrency}, "
        f"reference margin {margin if margin is None else f'{margin:.3g}'}"
    )
    if iso.holds is False:
        base = (
            f"contamination between sessions: perturbation showed outputs depending on other sessions' "
            f"content (see the levels' isolation verdicts); {where}"
        )
    elif iso.holds and iso.every_level:
        tie = " (a near-tie)" if margin is not None and margin < NEAR_TIE else ""
        base = (
            f"engine batch variance (shape-dependent numerics): isolation proven by perturbation at every "
            f"level, so the output depends on the batch's shape, never on the other sessions' content; "
            f"{where}{tie}"
        )
    else:
        base = f"unclassified: isolation was not proven at every level; {where}"
    return f"{base}; numpy oracle: {oracle}"
