"""The endpoint README's sections on the proofs that plant or cut something: the canaries (a code in one prompt,
searched for in every later answer) and the cancel-and-retry runs; and how a divergence is written."""

from __future__ import annotations

from typing import Any, Callable

from meshbench.analysis import canary as plant
from meshbench.analysis import endpoint_margins
from meshbench.engine import apis
from meshbench.names import RESULTS
from meshbench.records.margins import MarginPasses
from meshbench.results import markdown
from meshbench.results.typed import EndpointBundle


def canaries(b: EndpointBundle) -> list[str]:
    """Each level's canary run, and every answer searched for every code sent before or beside it."""
    found = b.results.canaries
    runs = [(lv.concurrency, lv.canary) for lv in b.results.levels if lv.canary is not None]
    if found is None or not runs:
        return []
    deaf = [str(c) for c, run in runs if c > 1 and not run.echoed]
    verdict = (
        "**yes: a canary crossed**"
        if found.leak
        else "no canary crossed"
        if found.leak is False
        else f"not judged ({found.failed} canary answers failed)"
        if found.failed
        else "not judged (at C = " + ", ".join(deaf) + " no session repeated even its own code: a leak would not "
        "show there)"
        if deaf
        else "not judged (no level of two or more sessions)"
    )
    rows = [
        f"| {c} | {len(run.sessions)} | {len(run.echoed)} | {sum(h.carrier_level == c for h in found.hits)} |"
        for c, run in runs
    ]
    hits = [
        f"- {markdown.inline(h.canary)}, carried by {markdown.inline(h.carrier)} at C={h.carrier_level}, in "
        f"{markdown.inline(h.receiver)}'s answer ({markdown.inline(h.where)}, by {' and '.join(h.by)})"
        for h in found.hits[:HITS_LISTED]
    ]
    more = len(found.hits) - len(hits)
    every = [i for _, run in runs for i in run.canary_ids]
    by_ids = apis.recorded(b.results.endpoint.api).ids and plant.ids_usable(every)
    where = (
        "their text and their token ids"
        if by_ids
        else "their text (the server's tokenizer gave the codes no ids of their own to search by)"
        if apis.recorded(b.results.endpoint.api).ids
        else "their text"
    )
    return [
        "## Canaries",
        "",
        "At each level, the first C sessions were submitted together (a server with fewer slots queues the rest), "
        "each prompt its own random code repeated (a planted canary), each request otherwise as the sweep sends it. "
        f"Each answer sent beside or after a canary run ({found.searched} of them) was then searched for every code "
        f"sent before or beside it but the one its own request carried, in {where}. No model writes such a code by "
        "chance: a hit is a proven leak, naming the session that carried the code and the one whose answer holds "
        "it. The search has power only where a model repeats the code before it: here "
        f"{found.echoed} of the {found.planted} sessions repeated their own. A leak that puts another's ids where "
        "a model does not continue them (the start of a prompt, say) need not surface here; the perturbation test "
        f"looks there. Leak: {verdict}.",
        "",
        "| C | codes planted | repeated by their own session | found in another answer |",
        "|---|---|---|---|",
        *rows,
        "",
        *hits,
        *([f"- and {more} more (`{RESULTS}`, canaries.hits)"] if more > 0 else []),
        *([""] if hits else []),
    ]


HITS_LISTED = 20


def cancels(b: EndpointBundle) -> list[str]:
    """Each level's cancel-and-retry run: what the cancellations did to the others, and the retries against cold."""
    runs = [(lv.concurrency, lv.cancel) for lv in b.results.levels if lv.cancel is not None]
    if not runs:
        setting = b.cfg.workload.cancel
        return ["Cancel and retry: off (workload.cancel).", ""] if setting == "off" else []
    rows, named = [], []
    sampled = bool(b.cfg.engine.temperature)  # (a drawn token's margin classifies nothing)
    count = (lambda found: f"{len(found)} changed") if sampled else kinds
    for c, run in runs:
        v = run.verdict
        affected = (
            f"not judged ({v.failed} failed)"
            if v.failed
            else "not judged (no client was cut)"
            if not v.cut
            else f"not judged ({v.unjudged} with no cold answer, reference or margins to judge by)"
            if v.affected is None and v.unjudged
            else "not judged (sampled: an answer changed, and a drawn token's margin decides nothing)"
            if v.affected is None and b.cfg.engine.temperature
            else "not judged (a margin unknown)"
            if v.affected is None
            else ("**yes**" if v.affected else "no")
        )
        rows.append(
            f"| {c} | {', '.join(run.cancelled)} | {run.at_token} | {v.cut} of {len(run.cancelled)} | "
            f"{len(run.sessions) - len(run.cancelled)} | {count(v.others_differing) if v.others_differing else '0'} | "
            f"{count(v.retries_differing) if v.retries_differing else '0'} | {affected} |"
        )
        named += [
            f"- C={c}: {markdown.inline(d.session_id)} ({'retried' if d.session_id in run.cancelled else 'ran through'}"
            f"), token {d.token_index}, margin {margin(d.margin)}; in flight beside it: "
            f"{', '.join(map(markdown.inline, d.beside)) or 'none'}"
            for d in [*v.others_differing, *v.retries_differing]
            if d.kind == "confident" and not sampled
        ]
    return [
        "## Cancel and retry",
        "",
        "At each level of two or more sessions, the first C were submitted together (the reference; a server with "
        "fewer slots queues the rest), then again with every second session's client disconnecting once the token "
        "shown was in (cut: those still streaming then) and sending its request again at once; every request asks "
        "for the server's top-2 log-probabilities and is otherwise as the sweep sends it. An answer that equals an "
        "output its session gave without any cancellation at this level (the reference, the timed repetitions) or, "
        "for a retried one, its cold answer (alone, `cache_prompt` false) is unaffected. Any other is listed where "
        "it first leaves its reference (ran through) or its cold answer (retried): a margin of at most "
        f"{runs[0][1].verdict.threshold:.3g}, {threshold_source(b.results.margins)}, is a near-tie (the batch "
        "changed shape when the cancelled requests left and came back); a larger one is confident, which the numerics "
        "measured "
        "here do not explain and a slot, a cache entry or a KV cell left behind by a cancelled request would: a "
        "finding to reproduce, named with the sessions in flight beside it.",
        "",
        "| C | cancelled | at token | cut | ran through | ran through, with a new output | retried, with a new output "
        "| affected |",
        "|---|---|---|---|---|---|---|---|",
        *rows,
        "",
        *named,
        *([""] if named else []),
    ]


MAX_LISTED = 20  # confident divergences listed in a README (all are in results.json)


def confident_lines(found: list[Any], why: Callable[[Any], str]) -> list[str]:
    """The README's list of confident divergences (``why``: what makes each confident, in words), at most
    MAX_LISTED, the rest counted; a blank line after any."""
    lines = []
    for x in found[:MAX_LISTED]:
        rep = "a needle trial" if x.repetition is None else f"repetition {x.repetition}"
        lines.append(
            f"- Confident: {x.session_id} at C={x.concurrency}, {rep}, token {x.token_index}, {why(x)}; "
            f"beside: {', '.join(x.beside) or 'none'}."
        )
    if len(found) > MAX_LISTED:
        lines.append(f"- ... and {len(found) - MAX_LISTED} more in `{RESULTS}` (divergences.confident).")
    return lines + ([""] if found else [])


def kinds(found: list[Any]) -> str:
    kinds = [x.kind for x in found]
    return ", ".join(f"{kinds.count(k)} {k}" for k in ("near-tie", "confident", "unknown") if k in kinds) or "none"


def margin(m: float | None) -> str:
    return "unknown" if m is None else f"{m:.3g}"


def threshold_source(passes: MarginPasses | None) -> str:
    """Where a near-tie threshold came from, in words: measured, or the floor or the cap instead."""
    measured = None if passes is None else endpoint_margins.numerics(passes)
    if measured is None:
        return f"the floor (no margin change was measured: {'no margin passes' if passes is None else 'no token'})"
    if endpoint_margins.near_tie(passes) == endpoint_margins.CAP:
        return "the cap (the server's margins are inconsistent with its own answers)"
    if measured < endpoint_margins.FLOOR:
        return f"the floor (this run's measured numerics, {measured:.3g}, are below it)"
    return "this run's measured numerics"
