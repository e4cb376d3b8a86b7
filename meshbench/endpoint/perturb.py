"""The perturbation test of one endpoint level (meshbench.analysis.perturbation): the first C sessions submitted
at once, 2R times, alternating a null run (every prompt as it is) and a perturbed run (each neighbour's prompt ids
after the first replaced by fresh ones, drawn at random from the ids of the workload's prompts: the same lengths,
other content, in every perturbed run anew).

Which runs are perturbed is drawn at random (seeded, recorded), so nothing carried from one run to the next lines
up with the labels. Every request of these runs bans eos (all generate exactly their token count) and is sent with
``cache_prompt`` false (nothing reused from an earlier run: every prompt computed whole), so the batches the
server forms are alike in both kinds of run. Only the neighbours' content differs. Native API only (token ids)."""

from __future__ import annotations

import numpy as np

from meshbench.analysis import perturbation as test
from meshbench.endpoint.client import Endpoint
from meshbench.endpoint.load import Job, at_once
from meshbench.engine import apis
from meshbench.records import serial
from meshbench.records.perturbation import Perturbation, PerturbationRun

RUNS = test.RUNS  # of each kind: a clean separation gives p = 2/924 = 0.002


def perturbation(
    endpoint: Endpoint, jobs: list[Job], c: int, rng: np.random.Generator, cache_path: bool = False
) -> Perturbation | None:
    """The level's test (None: one session, or the OpenAI API, whose prompts are text). ``cache_path``: through the
    server's prompt cache, as the sweep sends requests (no ``cache_prompt`` false); each run is then primed, the
    neighbours' prompts of the run sent at once first (one token each), so that whatever a target reads from a
    slot or the cache another request left is that run's content, null or perturbed, as a stale-slot leak reads."""
    if c < 2 or not apis.of(endpoint.api).ids:
        return None
    batch = jobs[:c]
    half = (c + 1) // 2
    targets, neighbours = batch[:half], batch[half:]
    plan = test.planned([j.body["prompt"] for j in jobs], [j.body["prompt"] for j in neighbours], rng)
    records = []
    for i, (perturbed, prompts) in enumerate(plan):
        # every run computes every prompt, to its last token (on the cache path: what the cache does not hold)
        cold = {"ignore_eos": True} if cache_path else {"ignore_eos": True, "cache_prompt": False}
        if cache_path:
            at_once(endpoint, [Job(j.session_id, {**j.body, **cold, "prompt": p, "n_predict": 1})
                               for j, p in zip(neighbours, prompts)])  # fmt: skip
        sent = [Job(j.session_id, {**j.body, **cold}) for j in targets] + [
            Job(j.session_id, {**j.body, **cold, "prompt": p}) for j, p in zip(neighbours, prompts)
        ]
        done = at_once(endpoint, sent)
        records.append(
            PerturbationRun(
                run=i,
                perturbed=perturbed,
                targets=[serial.completion(x.to_dict()) for x in done[:half]],
                neighbour_prompts=prompts,
                neighbours_failed=[x.session_id for x in done[half:] if x.error is not None],
            )
        )
    return Perturbation(
        targets=[j.session_id for j in targets],
        neighbours=[j.session_id for j in neighbours],
        runs=records,
        verdict=test.verdict(records),
    )
