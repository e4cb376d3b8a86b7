"""Does a target's output depend on its neighbours' content? An exact permutation test over interleaved runs.

At one level the same C sessions are submitted at once, 2R times, alternating: a null run (every prompt as it
is) and a perturbed run (the neighbours' prompt ids shuffled, BOS first: the same token lengths, so the same
batch shapes, other content). Every session generates exactly its token count (eos banned), so the batches
stay alike. Under the hypothesis that no target's output depends on its neighbours' content, the 2R runs are
exchangeable: which of them were perturbed does not matter.

The statistic counts (target, perturbed run) pairs whose output never appeared in any null run: outputs that
appear only under perturbation. Its p-value is exact: the fraction of the C(2R, R) relabellings of the runs
into null and perturbed whose statistic is at least the observed one. A run-to-run variation (the null's own)
shows up under every labelling alike; only content dependence makes the true labelling stand out. With R = 5,
the smallest p-value is 1/252 = 0.004; a level is judged dependent below ALPHA.
"""

from __future__ import annotations

import itertools
from typing import Sequence

from meshbench.records.perturbation import PerturbationRun, PerturbationVerdict

ALPHA = 0.01
Output = tuple[int | str, ...]


def statistic(outputs: Sequence[Sequence[Output]], perturbed: Sequence[bool]) -> int:
    """``outputs[run][target]``; the (target, perturbed run) pairs whose output no null run gave."""
    targets = range(len(outputs[0])) if outputs else range(0)
    count = 0
    for t in targets:
        null = {outputs[r][t] for r in range(len(outputs)) if not perturbed[r]}
        count += sum(outputs[r][t] not in null for r in range(len(outputs)) if perturbed[r])
    return count


def verdict(runs: Sequence[PerturbationRun]) -> PerturbationVerdict:
    """The test over a level's runs (None: a failed answer, or no run of each kind)."""
    labels = [r.perturbed for r in runs]
    whole = all(c.error is None for r in runs for c in r.targets) and not any(r.neighbours_failed for r in runs)
    k = sum(labels)
    if not whole or not runs or k in (0, len(runs)) or not runs[0].targets:
        return PerturbationVerdict(statistic=0, labellings=0, p_value=1.0, alpha=ALPHA, depends=None, changed=[])
    # (ids and text: a stream may hold back an incomplete character's ids, never its text)
    outputs: list[list[Output]] = [[(*c.tokens, c.text) for c in r.targets] for r in runs]
    observed = statistic(outputs, labels)
    at_least = total = 0
    for chosen in itertools.combinations(range(len(runs)), k):
        relabelled = [i in chosen for i in range(len(runs))]
        total += 1
        at_least += statistic(outputs, relabelled) >= observed
    p = at_least / total
    changed = []
    for t, c in enumerate(runs[0].targets):
        null = {outputs[r][t] for r in range(len(runs)) if not labels[r]}
        if any(outputs[r][t] not in null for r in range(len(runs)) if labels[r]):
            changed.append(c.session_id)
    return PerturbationVerdict(
        statistic=observed,
        labellings=total,
        p_value=round(p, 6),
        alpha=ALPHA,
        depends=p < ALPHA,
        changed=changed,
    )
