"""The records of an endpoint's perturbation test: at one level, the same submission pattern run with the
neighbours' content fixed (the null) and with it replaced by other ids of the same lengths (perturbed),
interleaved; the targets' answers in every run, and the verdict (meshbench.analysis.perturbation)."""

from __future__ import annotations

from dataclasses import dataclass

from meshbench.records.completion import Completion


@dataclass(frozen=True, slots=True, kw_only=True)
class PerturbationRun:
    """One run: every target and neighbour submitted at once; ``perturbed`` runs send the neighbours' prompt ids
    shuffled (BOS kept first: the same lengths, other content)."""

    run: int
    perturbed: bool
    targets: list[Completion]
    neighbour_prompts: list[list[int]]  # the ids each neighbour was sent, in ``neighbours`` order
    neighbours_failed: list[str]  # neighbours whose answer failed (their outputs are not judged)


@dataclass(frozen=True, slots=True, kw_only=True)
class PerturbationVerdict:
    """Whether the targets' outputs depend on the neighbours' content: the statistic counts perturbed runs
    whose target output never appeared in a null run; its exact p-value is over every relabelling of the runs
    into null and perturbed."""

    statistic: int
    labellings: int
    p_value: float
    alpha: float
    depends: bool | None  # None: not judged (a failed answer, or too few runs to reach alpha)
    changed: list[str]  # targets with an output only under perturbation (significant or not)
    null_varied: list[str]  # targets whose null runs gave more than one output: noise a leak can hide in
    failed: int  # answers of the runs that failed (targets' and neighbours')


@dataclass(frozen=True, slots=True, kw_only=True)
class Perturbation:
    targets: list[str]
    neighbours: list[str]
    runs: list[PerturbationRun]
    verdict: PerturbationVerdict
