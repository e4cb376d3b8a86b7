"""The content-dependence section of an endpoint bundle's README: each level's perturbation test, and the same
test through the server's prompt cache where it ran (meshbench.analysis.perturbation)."""

from __future__ import annotations

from typing import Any

from meshbench.analysis import endpoint_margins, perturbation
from meshbench.results import markdown
from meshbench.results.endpoint_proofs_report import margin
from meshbench.results.typed import EndpointBundle


def _perturbed_how(b: EndpointBundle) -> str:
    """What the perturbed runs sent, in words: fresh ids of the workload's, after the BOS every prompt starts with,
    or every id where they start otherwise (perturbation.kept)."""
    prompt_ids = b.results.workload.prompt_ids or []
    after = " after BOS" if perturbation.kept(prompt_ids) else " (every id: the server adds no BOS)"
    tests = [p for lv in b.results.levels for p in (lv.perturbation, lv.perturbation_cache) if p is not None]
    if b.results.schema_version < 4 and perturbation.rearranged(
        tests, dict(zip(b.cfg.workload.session_ids(), prompt_ids))
    ):
        return f"the neighbours' prompt ids rearranged{after}: the same lengths, other content"
    return (
        f"the neighbours' prompt ids{after} replaced by fresh ones drawn from the workload's ids: the same lengths, "
        "other content, so a target that reads any function of its neighbours' ids shows it"
    )


def section(b: EndpointBundle) -> list[str]:
    """Each level's perturbation test: does a target's output depend on its neighbours' content? Then the same
    test through the server's prompt cache, where it ran."""
    tested = [(lv.concurrency, lv.perturbation) for lv in b.results.levels if lv.perturbation is not None]
    if not tested:
        return []
    cached = [(lv.concurrency, lv.perturbation_cache) for lv in b.results.levels if lv.perturbation_cache is not None]
    cold, threshold = endpoint_margins.cold_answers(b.results.margins), endpoint_margins.near_tie(b.results.margins)
    sampled = bool(b.cfg.engine.temperature)  # (a drawn token: its margin says nothing of why it changed)
    cache_words = (
        "the test runs the server's path without its prompt cache and says nothing of that cache (the warm "
        "answers, the canaries and the cancel runs go through it)"
        if not cached
        else "the test runs the server's path without its prompt cache; the second table below runs it again "
        "through the cache"
    )
    lines = [
        "## Content dependence: perturbation against a run-to-run null",
        "",
        "At each level of two or more sessions, the first C sessions were submitted at once, again and again: "
        "null runs (every prompt as it is) and perturbed runs ("
        + _perturbed_how(b)
        + "), which runs were perturbed drawn at random. Every request of these runs "
        "bans eos and is sent with `cache_prompt` false, so nothing carries from one run to the next and the "
        f"batches stay alike: {cache_words}. The statistic counts perturbed "
        "runs in which a target gave an output no null run "
        "gave; its p-value is exact, over every relabelling of the runs into null and perturbed (run-to-run "
        f"variation shows under every labelling alike). Below {tested[0][1].verdict.alpha:g}, the targets' outputs "
        "depend on their neighbours' content. Not detected means no more than that: only the targets (the first "
        "half) are tested, against the neighbours (the rest), and where a target's null runs already disagree "
        "(null varied), a leak can hide in that noise. A dependence is not a leak of content by itself: where "
        "an output changes, the cold answer's margin says whether the choice was a near-tie (within the measured "
        "numerics: the neighbours' content changed how the server computed it, through which slot or cache path "
        "it took) or confident. On a single-slot or batch-invariant server any dependence is conclusive."
        + (
            " Sampled here: a changed token was drawn, and its margin says nothing of why it changed, so only "
            "where it changes is given."
            if b.cfg.engine.temperature
            else ""
        ),
        "",
        *_table(tested, cold, threshold, sampled),
    ]
    if cached:
        lines += [
            "Through the prompt cache: the same test with every request sent as the sweep sends it (no "
            "`cache_prompt` false), each run primed by sending its neighbours' prompts first (one token each), so "
            "that whatever a target reads from a slot or a cache entry another request left is that run's content, "
            "null or perturbed, as a stale slot or a cache entry served to the wrong request would give it. The "
            "cache makes a target's later runs warm where its first was cold, so its null runs may vary by numerics.",
            "",
            *_table(cached, cold, threshold, sampled),
        ]
    return lines


def _table(tested: list[Any], cold: dict[str, Any], threshold: float, sampled: bool) -> list[str]:
    rows = []
    for c, p in tested:
        v, kinds = p.verdict, [x.perturbed for x in p.runs]
        depends = (
            f"not judged ({v.failed} failed)"
            if v.failed
            else "not judged"
            if v.depends is None
            else ("**yes**" if v.depends else "not detected")
        )
        rows.append(
            f"| {c} | {', '.join(p.targets)} | {', '.join(p.neighbours)} | {kinds.count(False)} + "
            f"{kinds.count(True)} | {v.statistic} | {v.p_value:.4g} | {depends} | {', '.join(v.changed) or '-'} | "
            f"{', '.join(v.null_varied) or '-'} | {_flips(perturbation.flips(p.runs, cold, threshold), sampled)} |"
        )
    return [
        "| C | targets | neighbours | runs (null + perturbed) | statistic | p-value | depends on neighbours | "
        "targets with an output only under perturbation | null varied | where it changes (cold margin) |",
        "|---|---|---|---|---|---|---|---|---|---|",
        *rows,
        "",
    ]


def _flips(found: list[Any], sampled: bool = False) -> str:
    return (
        "; ".join(
            f"{markdown.inline(f.session_id)}: token {f.token_index}"
            + ("" if sampled else f", {margin(f.margin)} ({f.kind})" if f.margin is not None else ", margin unknown")
            for f in found
        )
        or "-"
    )
