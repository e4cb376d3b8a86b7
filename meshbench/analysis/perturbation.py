"""Does a target's output depend on its neighbours' content? An exact permutation test over interleaved runs.

At one level the same C sessions are submitted at once, 2R times, alternating: a null run (every prompt as it is)
and a perturbed run (the neighbours' prompt ids after BOS replaced by fresh ones drawn from the workload's ids: the
same token lengths, so the same batch shapes, other content: a target that reads any function of its neighbours'
ids, their order, their sum or their multiset, sees it change). Every session generates exactly its token count (eos
banned), so the batches stay alike. Under the hypothesis that no target's output depends on its neighbours' content,
the 2R runs are exchangeable: which of them were perturbed does not matter.

The statistic counts (target, perturbed run) pairs whose output never appeared in any null run: outputs that appear
only under perturbation. Its p-value is exact: the fraction of the C(2R, R) relabellings of the runs into null and
perturbed whose statistic is at least the observed one. A run-to-run variation (the null's own) shows up under every
labelling alike; only content dependence makes the true labelling stand out. With R = 5, a clean separation gives p
= 2/252 = 0.008 (the true labelling and its complement tie), with R = 6 (the runs meshbench.endpoint.perturb makes)
2/924 = 0.002; a level is judged dependent below ALPHA, and not judged where too few runs could not reach it. A "no"
means no dependence was detected, of the targets (the first half of the C sessions) on the neighbours (the rest): a
leak among the targets, or from a target into a neighbour, is not tested; and where the null runs already disagree
with each other (``null_varied``), a leak hides in that noise.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from meshbench.analysis.endpoint_margins import first_difference
from meshbench.records.completion import Completion
from meshbench.records.perturbation import Perturbation, PerturbationRun, PerturbationVerdict

ALPHA = 0.01
RUNS = 6  # of each kind, in meshbench.endpoint.perturb: C(12, 6) = 924 relabellings
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
    """The test over a level's runs. ``depends`` is None where it cannot say: a failed answer, no run of each
    kind, or too few runs for a clean separation (p = 2 / C(2R, R), the true labelling and its complement) to
    reach ALPHA."""
    labels = [r.perturbed for r in runs]
    k = sum(labels)
    whole = all(c.error is None for r in runs for c in r.targets) and not any(r.neighbours_failed for r in runs)
    failed = sum(c.error is not None for r in runs for c in r.targets) + sum(len(r.neighbours_failed) for r in runs)
    if not whole or not runs or k in (0, len(runs)) or not runs[0].targets:
        return PerturbationVerdict(
            statistic=0, labellings=0, p_value=1.0, alpha=ALPHA, depends=None, changed=[], null_varied=[], failed=failed
        )
    # (ids and text: a stream may hold back an incomplete character's ids, never its text)
    outputs: list[list[Output]] = [[(*c.tokens, c.text) for c in r.targets] for r in runs]
    observed = statistic(outputs, labels)
    at_least = total = 0
    for chosen in itertools.combinations(range(len(runs)), k):
        relabelled = [i in chosen for i in range(len(runs))]
        total += 1
        at_least += statistic(outputs, relabelled) >= observed
    p = at_least / total
    changed, varied = [], []
    for t, c in enumerate(runs[0].targets):
        null = {outputs[r][t] for r in range(len(runs)) if not labels[r]}
        if any(outputs[r][t] not in null for r in range(len(runs)) if labels[r]):
            changed.append(c.session_id)
        if len(null) > 1:
            varied.append(c.session_id)
    powered = 2 / math.comb(len(runs), k) < ALPHA
    return PerturbationVerdict(
        statistic=observed,
        labellings=total,
        p_value=round(p, 6),
        alpha=ALPHA,
        depends=(p < ALPHA) if powered else None,
        changed=changed,
        null_varied=varied,
        failed=0,
    )


def rearranged(tests: Sequence[Perturbation], prompts: Mapping[str, Sequence[int]]) -> bool:
    """Did every test send, as each perturbed prompt, a rearrangement of that neighbour's own ids (how schema-3
    bundles were made, before fresh ids were drawn)? ``prompts``: each session's prompt ids. False where nothing was
    perturbed."""
    sent = [
        (q, prompts.get(n, ()))
        for p in tests
        for x in p.runs
        if x.perturbed
        for n, q in zip(p.neighbours, x.neighbour_prompts)
    ]
    return bool(sent) and all(sorted(q) == sorted(own) for q, own in sent)


def kept(prompts: Sequence[Sequence[int]]) -> int:
    """How many leading ids a perturbation keeps: one where every prompt starts with the same id (the BOS the server
    adds), else none (a server that adds no BOS: every id is the prompt's content)."""
    firsts = {tuple(p[:1]) for p in prompts}
    return 1 if len(firsts) == 1 and all(len(p) >= 1 for p in prompts) else 0


def planned(
    every: Sequence[Sequence[int]], neighbours: Sequence[Sequence[int]], rng: np.random.Generator
) -> list[tuple[bool, list[list[int]]]]:
    """A test's runs as meshbench.endpoint.perturb sends them, drawn from ``rng`` (the sweep's, seeded by the
    workload, one for every test of the sweep in level order), so verify can draw them again: which runs are
    perturbed (RUNS of each, at random), and each run's neighbour prompts (``every``: the workload's prompts, which
    the fresh ids are drawn from)."""
    order = [bool(x) for x in rng.permutation([0] * RUNS + [1] * RUNS)]
    pool, head = id_pool(every), kept(every)
    return [(p, [fresh(list(q), pool, rng, head) if p else list(q) for q in neighbours]) for p in order]


def fresh(ids: list[int], pool: list[int], rng: np.random.Generator, head: int = 1, tries: int = 8) -> list[int]:
    """Other content of the same length: the first ``head`` ids (a BOS, ``kept``) kept, every other drawn at
    random from ``pool`` (the workload's own ids, so every id is one the model reads in a prompt), drawn again where
    it came out the same; where it always does (a pool of one id), each id after those kept + 1."""
    start, tail = list(ids[:head]), list(ids[head:])
    for _ in range(tries if len(pool) > 1 else 0):
        drawn = [int(pool[k]) for k in rng.integers(0, len(pool), size=len(tail))]
        if drawn != tail:
            return start + drawn
    return start + [t + 1 for t in tail]


def id_pool(prompts: Sequence[Sequence[int]]) -> list[int]:
    """The ids a perturbed prompt is drawn from: every id of the workload's prompts after those kept, once each."""
    head = kept(prompts)
    return sorted({t for p in prompts for t in p[head:]})


def is_perturbation(null: Sequence[int], sent: Sequence[int], pool: Sequence[int], head: int = 1) -> bool:
    """Is ``sent`` what meshbench.endpoint.perturb sends for ``null``: its first ``head`` ids (kept: a BOS), then
    other ids of the workload's (``pool``, id_pool), or (a pool of one id) each of ``null``'s + 1?"""
    if len(sent) != len(null) or list(sent[:head]) != list(null[:head]) or list(sent) == list(null):
        return False
    tail, other = list(null[head:]), list(sent[head:])
    return set(other) <= set(pool) or other == [t + 1 for t in tail]


def flips(runs: Sequence[PerturbationRun], cold: dict[str, Completion], threshold: float) -> list[Flip]:
    """Where each target whose output changed under perturbation changed: the first token where its first
    perturbed-only output leaves its most frequent null output, and the cold answer's margin there (where the
    cold answer agrees with both up to it): a near-tie within the measured numerics, or confident."""
    out = []
    for t in range(len(runs[0].targets) if runs else 0):
        null = [tuple(r.targets[t].tokens) for r in runs if not r.perturbed and r.targets[t].error is None]
        sid = runs[0].targets[t].session_id
        novel = [
            tuple(r.targets[t].tokens)
            for r in runs
            if r.perturbed and r.targets[t].error is None and tuple(r.targets[t].tokens) not in set(null)
        ]
        if not null or not novel:
            continue
        usual = max(set(null), key=null.count)
        k = first_difference(usual, novel[0])
        a = cold.get(sid)
        margin = None
        if k is not None and a is not None and a.margins is not None and list(a.tokens[:k]) == list(usual[:k]):
            margin = a.margins[k] if k < len(a.margins) else None
        kind = "unknown" if margin is None else "near-tie" if margin <= threshold else "confident"
        if kind == "near-tie" and a is not None and k is not None and not _between_top_two(a, novel[0], k):
            kind = "unknown"  # (to a third choice, whose margin was not asked for: neither proven close nor far)
        out.append(Flip(session_id=sid, token_index=k, margin=margin, kind=kind))
    return out


def _between_top_two(cold: Completion, novel: Sequence[int], k: int) -> bool:
    """Is ``novel``'s token ``k`` the cold answer's first or second choice there (True where the second is not
    known: no runner-up recorded)?"""
    second = cold.runner_up[k] if cold.runner_up is not None and k < len(cold.runner_up) else None
    return second is None or k >= len(novel) or novel[k] in (second, *cold.tokens[k : k + 1])


@dataclass(frozen=True, slots=True)
class Flip:
    """Where a target's output changed under perturbation, and how close the choice was there."""

    session_id: str
    token_index: int | None
    margin: float | None
    kind: str
