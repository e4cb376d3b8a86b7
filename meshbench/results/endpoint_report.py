"""The README of an endpoint bundle, rendered from its results.json alone (verify renders it again and
compares)."""

from __future__ import annotations

import json
from typing import Any

from meshbench.analysis import endpoint_margins
from meshbench.analysis.endpoint_margins import SHARED_MIN, common_prefix
from meshbench.engine import apis, servers
from meshbench.engine.spec import samplers
from meshbench.names import RESULTS
from meshbench.records.context import EndpointInfo
from meshbench.records.endpoint_figures import LevelFigures, Spread
from meshbench.results import (
    accounting_report,
    conversation_report,
    draws_report,
    markdown,
    open_loop_report,
    perturbation_report,
)
from meshbench.results import endpoint_proofs_report as proofs_report
from meshbench.results.endpoint_proofs_report import kinds, margin
from meshbench.results.markdown import median_range
from meshbench.results.typed import EndpointBundle

TABLE_HEADER = (
    "| C | differ from C=ref | max distinct per session | needle distinct / differ from alone | "
    "tok/s | total tok/s | TTFT p50 ms | TTFT p99 ms | ITL p50 ms | ITL p99 ms | E2E p50 ms | "
    "failed | early stops |"
)


def cell(spread: Spread | None, digits: int = 1) -> str:
    """A figure over the repetitions: the median, and min..max when they differ."""
    return median_range(spread, f".{digits}f", sep="..", drop_equal=True)


def shared_prefixes(prompt_ids: list[list[int]] | None) -> str:
    """What the sessions' prompts share, as the server tokenized them: the groups of sessions whose prompts begin
    with the same SHARED_MIN ids (sharing at least that many is an equivalence: the same first SHARED_MIN ids), each
    with the run all its members begin with ("" where none share one, or the ids were not recorded)."""
    groups: dict[tuple[int, ...], list[list[int]]] = {}
    for ids in prompt_ids or []:
        if len(ids) >= SHARED_MIN:
            groups.setdefault(tuple(ids[:SHARED_MIN]), []).append(ids)
    shared = sorted(
        ((len(m), min(common_prefix(m[0], other) for other in m[1:])) for m in groups.values() if len(m) > 1),
        reverse=True,
    )
    if not shared:
        return ""
    lengths = sorted(n for _, n in shared)
    span = str(lengths[0]) if lengths[0] == lengths[-1] else f"{lengths[0]}-{lengths[-1]}"
    return (
        f"; {sum(k for k, _ in shared)} of them in {len(shared)} group(s) of {', '.join(str(k) for k, _ in shared)}, "
        f"each group's prompts beginning with the same {span} tokens"
    )


def _launched(e: EndpointInfo) -> list[str]:
    """The server meshbench started for the sweep, as it started it."""
    x = e.launched
    if x is None:
        return []
    flags = markdown.inline(" ".join(x.args)) if x.args else "none"
    return [
        f"meshbench started {markdown.inline(x.server)} (version {markdown.inline(x.version)}) on "
        f"{markdown.inline(x.model)}, on a free loopback port; its flags beside the model, host and port: {flags}; "
        "everything else is the server's own default."
    ]


def _sent(request: dict[str, Any] | None, per_request: bool = False) -> list[str]:
    """What every request asked of the server beside its prompt (absent from bundles made before it was
    recorded); with a seed per session, the first session's seed."""
    if request is None:
        return []
    if per_request:
        request = {**request, "seed": f"{request.get('seed')} + k (session k)"}
    cache = (
        f"cache_prompt {str(request['cache_prompt']).lower()}, as chosen (--cache-prompt)"
        if "cache_prompt" in request
        else "no cache_prompt: the server's prompt cache as its own default sets it"
    )
    fields = markdown.inline(", ".join(f"{k} {json.dumps(v)}" for k, v in request.items()))
    return [f"Every request carried, beside its prompt and token counts: {fields}; {cache}."]


def _dash(x: object) -> str:
    return "-" if x is None else str(x)


def figure_cells(f: LevelFigures) -> list[str]:
    """The per-level table's figures, in its columns' order, with their digits."""
    return [
        cell(f.tokens_per_s),
        cell(f.total_tokens_per_s),
        cell(f.ttft_ms_p50),
        cell(f.ttft_ms_p99),
        cell(f.itl_ms_p50, 2),
        cell(f.itl_ms_p99, 2),
        cell(f.e2e_ms_p50),
        cell(f.failed, 0),
        cell(f.early_stops, 0),
    ]


def table_rows(b: EndpointBundle) -> list[list[str]]:
    v = b.results.verdicts
    rows = []
    for lv in b.results.levels:
        c = lv.concurrency
        needle = v.needle[c]
        rows.append(
            [
                str(c),
                str(len(v.differing_sessions[c])),
                str(max(v.distinct_outputs[c].values(), default=0)),
                f"{needle.distinct} / {_dash(needle.differs_from_alone)}",
                *figure_cells(lv.figures),
            ]
        )
    return rows


def _named(b: EndpointBundle) -> list[str]:
    """Where no divergence was classified by its margin (text without margins, or sampled), the sessions each
    verdict failed on, by name (empty: none failed, or the divergences section names them)."""
    r = b.results
    v = r.verdicts
    if r.divergences is not None and not r.divergences.by_draw:
        return []
    rows = []
    for c, differing in v.differing_sessions.items():
        many = [sid for sid, n in v.distinct_outputs.get(c, {}).items() if n > 1]
        needle = v.needle.get(c)
        moved = needle is not None and (needle.distinct > 1 or (needle.differs_from_alone or 0) > 0)
        if differing or many or moved:
            cells = [markdown.inline(", ".join(x)) if x else "-" for x in (differing, many)]
            rows.append(f"| {markdown.inline(str(c))} | " + " | ".join(cells) + f" | {'yes' if moved else 'no'} |")
    if not rows:
        return []
    head = "| C | output other than at the reference level | more than one output over the repetitions | needle moved |"
    return ["## The sessions that changed", "", head, "|---|---|---|---|", *rows, ""]


def _not_proved(b: EndpointBundle) -> list[str]:
    """The proofs this server and API could not give, and why: from the API, the flavour and the decoding, never
    from a record's absence (empty: every proof ran that the sweep's settings ask for)."""
    e, eng = b.results.endpoint, b.cfg.engine
    api, flavour = apis.recorded(e.api), servers.recorded(e.server)
    out = []
    if not api.ids:
        out.append(f"- content dependence (the perturbation test) and cancel and retry: the {e.api} API carries "
                   "no token ids, so a neighbour's prompt cannot be replaced by fresh ids, nor a cut answer "
                   "judged.")  # fmt: skip
    if not flavour.logprobs:
        out.append(f"- margins (near-ties; cold, warm and after a sibling): a {e.server} server gives no "
                   "log-probabilities, so no change could be classified, and none is excused.")  # fmt: skip
    if flavour.counted:
        out.append(f"- each prompt's token ids: a {e.server} server tokenizes nothing meshbench can ask, so each "
                   "prompt's length is its own count (usage), no prompt is found to start like another's (no "
                   "margins after a sibling) and no conversation's turns are measured.")  # fmt: skip
    if eng.temperature and not (b.results.divergences and b.results.divergences.by_draw):
        out.append("- the classification of a divergence, and so the cancel-and-retry verdict: a sampled token is "
                   "drawn, and its margin explains nothing; no change is excused as a near-tie (every one counts "
                   "against the verdicts above), and none is judged a leak by its margin.")  # fmt: skip
    elif eng.temperature:
        out.append("- the cancel-and-retry verdict, and the classification of the perturbation test's, the open "
                   "loop's and the conversations' divergences: their answers list no candidates (only the margin "
                   "passes do), so only the sweep's own divergences are placed by the draw.")  # fmt: skip
    return ["## What this bundle could not prove", "", *out, ""] if out else []


def _decoding(b: EndpointBundle) -> str:
    eng, seed = b.cfg.engine, b.results.workload.seed
    if not eng.temperature:
        return "greedy"
    nucleus = "".join(f", {name} {value:g}" for name, value in samplers(eng).items())
    seeds = f"session k's seed {seed} + k" if eng.seed_per_request else f"every request's seed {seed}"
    promise = servers.recorded(b.results.endpoint.server).seeds
    by_draw = b.results.divergences is not None and b.results.divergences.by_draw
    how = "divergences classified by where each draw fell" if by_draw else "divergences not classified by margins"
    return (
        f"sampled (temperature {eng.temperature:g}{nucleus}; {seeds}; what the server promises of a seed: "
        f"{promise}; {how})"
    )


def _tokenizer(server: str) -> str:
    flavour = servers.recorded(server)
    if flavour.local:
        return "by meshbench with the model's own tokenizer, as transformers reads it from the file the server loads"
    if flavour.counted:
        return "by no one meshbench can ask, counted by the server (usage.prompt_tokens of one request each)"
    return "by the server"


def render_readme(b: EndpointBundle, name: str) -> str:
    r = b.results
    e, wl, v, why = r.endpoint, r.workload, r.verdicts, r.conclusions
    reps = len(r.levels[0].repetitions)
    lines = [
        f"# {markdown.inline(r.story)}: {markdown.inline(r.title)}",
        "",
        # (every string a server or a bundle supplies is escaped: a model name must not open a heading, a table
        # row, a tag or a comment that hides the report; verify renders the same and so holds the README to it)
        f"A serving endpoint as the node under test: {markdown.inline(e.server)} at {markdown.inline(e.url)} "
        f"({markdown.inline(e.api)} API"
        + (f", build {markdown.inline(e.build_info)}" if e.build_info else "")
        + f"), serving {', '.join(markdown.inline(str(m)) for m in e.models)}."
        + (f" It is {markdown.inline(e.server)} because {markdown.inline(e.detected)}." if e.detected else "")
        + ("" if e.loopback else f" The endpoint is not on this machine: host {markdown.inline(e.url)}."),
        *_launched(e),
        f"{wl.sessions} sessions from {markdown.code(str(wl.prompts))} "
        f"(sha256 {markdown.inline(wl.prompts_sha256[:12])}), tokenized {_tokenizer(e.server)} "
        f"({min(wl.prompt_tokens)}-{max(wl.prompt_tokens)} tokens), {min(wl.new_tokens)}-"
        f"{max(wl.new_tokens)} new tokens each, {_decoding(b)}, eos {wl.eos}"
        + shared_prefixes(wl.prompt_ids)
        + "; at each level C, C closed-loop clients; "
        f"{reps} repetition(s), the level order rotated each time. Made by {markdown.code(r.command)}.",
        *_sent(wl.request, b.cfg.engine.seed_per_request),
        "",
        "```",
        f"meshbench verify {name}",
        "```",
        "",
        "## Verdicts",
        "",
        f"Outputs compared: {v.compared}; the reference is concurrency {v.reference_concurrency}, repetition 0.",
        "",
        f"- **batch_invariant: {v.batch_invariant}**. {why.get(BATCH_INVARIANT)}",
        f"- **run_to_run_deterministic: {v.run_to_run_deterministic}**. {why.get(RUN_TO_RUN)}",
        f"- **needle_stable: {v.needle_stable}** (the needle is {markdown.inline(r.needle.prompt_of)}'s prompt). "
        f"{why.get(NEEDLE)}",
        "",
        "## Per level",
        "",
        f"Medians over {reps} repetition(s), with min..max where they differ; latencies from the client's stamps "
        "as each chunk arrived.",
        "",
        TABLE_HEADER,
        "|" + "---|" * 13,
        *("| " + " | ".join(row) + " |" for row in table_rows(b)),
        "",
        *perturbation_report.section(b),
        *proofs_report.canaries(b),
        *proofs_report.cancels(b),
        *_divergences(b),
        *conversation_report.section(b),
        *accounting_report.section(b),
        *open_loop_report.section(b),
        *_named(b),
        *_not_proved(b),
        f"Everything here is computed from `{RESULTS}` by `meshbench verify`; a rerun needs the server.",
        "",
    ]
    return "\n".join(lines)


# What each verdict means, by its name in the conclusions (meshbench.analysis.endpoint.CONCLUSIONS)
BATCH_INVARIANT, RUN_TO_RUN, NEEDLE = "batch_invariant", "run_to_run_deterministic", "needle"


def _after_sibling(b: EndpointBundle, differing: list[Any]) -> str:
    """The sibling pass in one sentence: each session whose prompt starts like an earlier one's, sent right after
    that sibling, where the server's prompt cache can serve the shared start from the sibling's KV; what the server
    says it reused (evaluated minus computed), against what the two prompts share; and its answer against cold."""
    r = b.results
    assert r.margins is not None
    after = r.margins.siblings or {}
    prompts = dict(zip((x.session_id for x in r.margins.cold), r.workload.prompt_ids or []))  # (every session)
    kinds_of = {"sibling": 0, "own": 0, "none": 0, "unsaid": 0}
    for x in r.margins.sibling or []:
        if x.error is not None or x.computed is None or x.evaluated is None or x.session_id not in after:
            kinds_of["unsaid"] += 1
            continue
        reused = x.evaluated - x.computed
        shared = common_prefix(prompts.get(x.session_id, []), prompts.get(after[x.session_id], []))
        kinds_of["none" if reused <= 0 else "sibling" if reused <= shared else "own"] += 1
    head = (
        f"Right after a sibling (each of the {len(after)} sessions whose prompt shares at least {SHARED_MIN} leading "
        "ids with an earlier one's, sent right after it): the server reused at most the shared start, which only "
        f"the sibling's KV could give, for {kinds_of['sibling']}; more than that (its own earlier KV, still in a "
        f"slot) for {kinds_of['own']}; nothing for {kinds_of['none']}"
        + (f"; it did not say for {kinds_of['unsaid']}" if kinds_of["unsaid"] else "")
        + ". "
    )
    if not differing:
        return head + "Every answer equals its cold one."
    listed = ", ".join(
        f"{x.session_id} after {', '.join(x.beside) or '?'} (token {x.token_index}, margin {margin(x.margin)}, "
        f"{x.kind})"
        for x in differing[:MAX_LISTED]
    )
    more = f" and {len(differing) - MAX_LISTED} more" if len(differing) > MAX_LISTED else ""
    return head + f"{len(differing)} differ from their cold answer: {listed}{more}."


def _second_choice(b: EndpointBundle) -> str:
    """What the runner-ups add to the near-tie rule, where they were recorded (a schema-3 bundle has none)."""
    if b.results.margins is None or not any(x.runner_up is not None for x in b.results.margins.cold):
        return ""
    return (
        " (only a change to the cold answer's second choice, which the server names by id: one to a third choice, "
        "whose distance the top two do not give, is unknown)"
    )


def _divergences(b: EndpointBundle) -> list[str]:
    """Every answer against its session's cold answer, classified by the margin where it first differs."""
    d = b.results.divergences
    if d is None:
        return []
    if d.by_draw:
        return draws_report.section(b)
    numerics = "no token to measure it on" if d.numerics is None else f"{d.numerics:.3g}"
    if said := endpoint_margins.caveats(b.results.margins):
        numerics += f" ({said})"
    rows = [
        f"| {c} | {x.answers} | {x.differing} | {x.near_ties} | {x.confident} | {x.unknown} |"
        for c, x in d.levels.items()
    ]
    warm = (
        "every warm answer equals its cold one"
        if not d.warm_differing
        else "warm differs from cold for "
        + ", ".join(f"{x.session_id} (token {x.token_index}, margin {margin(x.margin)})" for x in d.warm_differing)
    )
    lines = [
        "## Divergences, with margins",
        "",
        "Every session was also sent with the server's top-2 log-probabilities per token, outside the timed passes "
        "(asking costs the server time): alone and cold (`cache_prompt` false), alone and warm (right after "
        f"itself, as the sweep sends it), and with every session at once. Warm against cold: {warm}. All at once, "
        f"{len(d.together_differing)} of the sessions differ from their cold answer "
        f"({kinds(d.together_differing)}). Where a warm "
        f"or batched answer agrees with the cold one, the margin (top-1 minus top-2) moved by at most {numerics}: "
        "the server's own numerics here. Every answer of the sweep is compared with its session's cold answer. "
        f"Where it first differs, a cold margin of at most {d.threshold:.3g} (the numerics, and never below "
        f"{d.floor:g}) is a near-tie, classified as numerics{_second_choice(b)}; a larger "
        "one is confident, which these numerics do not explain: a suspected leak, listed with the sessions in "
        "flight beside it (none beside it points at the server's own state, such as its prompt cache, rather than "
        "a neighbour).",
        "",
        "| C | answers | differ from cold | near-ties | confident | unknown |",
        "|---|---|---|---|---|---|",
        *rows,
        "",
    ]
    lines += _unjudged_and_inconsistent(b)
    if d.sibling_differing is not None and b.results.margins is not None:
        lines += [_after_sibling(b, d.sibling_differing), ""]
    if d.near_ties:
        lo, hi = min(x.margin or 0.0 for x in d.near_ties), max(x.margin or 0.0 for x in d.near_ties)
        lines += [f"Near-tie margins: {lo:.3g} to {hi:.3g}.", ""]
    return lines + proofs_report.confident_lines(d.confident, lambda x: f"margin {margin(x.margin)}")


def _unjudged_and_inconsistent(b: EndpointBundle) -> list[str]:
    """What the divergences could not judge, and a server's margins that cannot be its arithmetic's."""
    assert b.results.divergences is not None
    lines = []
    unjudged = {c: x.unjudged for c, x in b.results.divergences.levels.items() if x.unjudged}
    if unjudged:
        lines += [
            "**Not judged:** "
            + ", ".join(f"{n} answers at C={c}" for c, n in unjudged.items())
            + " have no cold answer to compare with (its margin pass failed, or the server withheld it): none of them "
            "is counted as equal to its cold answer.",
            "",
        ]
    if (why := endpoint_margins.inconsistent(b.results.margins)) is not None:
        lines += [f"**The server's margins are inconsistent with its own answers:** {why}.", ""]
    return lines


MAX_LISTED = proofs_report.MAX_LISTED


def render_commands(b: EndpointBundle, name: str) -> str:
    return f"# made by\n{b.results.command}\n# verify\nmeshbench verify {name}\n"
