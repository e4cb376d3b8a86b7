"""The endpoint's proofs of content dependence, checked from the bundle: the margin passes (every session cold,
warm and together, with one margin per token, each answer whole) and the divergences recomputed from them; each
level's perturbation test (its sessions, its alternating runs, its perturbed prompts, its verdict recomputed)."""

from __future__ import annotations

import math

import numpy as np

from meshbench.analysis import endpoint_margins as margins
from meshbench.analysis import perturbation
from meshbench.analysis.checks import Checks
from meshbench.analysis.draws import SUM_SLACK
from meshbench.engine import apis
from meshbench.names import RESULTS
from meshbench.records.model import Completion, EndpointLevel
from meshbench.records.perturbation import Perturbation
from meshbench.results import kinds
from meshbench.results.typed import EndpointBundle

HOLD_BACK = 3  # (meshbench.endpoint.stream.HOLD_BACK: verify never imports the client)


def check_margins(
    c: Checks, b: EndpointBundle, ids: list[str], compared: str, lengths: dict[str, int], new: dict[str, int]
) -> None:
    """The margin passes answer every session once each way, with one margin per token; the divergences are
    recomputed from them and the levels (none without margin passes, or where text is compared)."""
    r = b.results
    if r.margins is not None:
        sides = (("cold", r.margins.cold), ("warm", r.margins.warm), ("together", r.margins.together))
        for side, answers in sides:
            c.equal(RESULTS, f"margins.{side} (every session once, in order)", ids, [x.session_id for x in answers])
            for x in answers:
                _check_answer(c, b, f"margins.{side}.{x.session_id}", x, lengths, new)
        _check_siblings(c, b, ids, lengths, new)
    expected = (
        None
        if r.margins is None or not margins.compares(r.endpoint.api, compared, b.cfg.engine.temperature, r.margins)
        else margins.divergences(r.levels, r.margins, r.needle.prompt_of)
    )
    c.equal(RESULTS, "divergences (recomputed from the margin passes and the levels)", expected, r.divergences)


def _check_runner_ups(c: Checks, b: EndpointBundle) -> None:
    """Over the native API, every answer that carries margins (the margin passes, the cancel runs, a conversation's
    cold re-sends) names each token's second choice (stripped of them, a near-tie would be judged by the margin
    alone, which the server reports), each an id exactly where its margin is, and never the token itself."""
    r = b.results
    if not apis.recorded(r.endpoint.api).ids:
        return
    answers = [x for x in _margined_answers(b) if x.error is None and x.margins is not None]
    if older(b) and not any(x.runner_up is not None for x in answers):
        c.notes.append(RUNNER_UP_ABSENT)
        return
    c.equal(RESULTS, "runner_up (every native answer with margins names each token's second choice)", True,
            all(x.runner_up is not None for x in answers))  # fmt: skip
    for x in answers:
        if x.runner_up is not None and x.margins is not None:
            c.equal(RESULTS, f"{x.session_id}.runner_up (an id exactly where a margin is, never the token itself)",
                    [[m is None for m in x.margins], False],
                    [[u is None for u in x.runner_up], any(u == t for u, t in zip(x.runner_up, x.tokens))])  # fmt: skip


def older(b: EndpointBundle) -> bool:
    """A pinned bundle of the older schema (3), judged by its own rules: made before the runner-ups, the sibling
    pass, the test through the prompt cache and fresh perturbed ids, each of which it may lack (noted)."""
    return b.results.schema_version == kinds.OLDER_ENDPOINT


RUNNER_UP_ABSENT = (
    "runner_up: absent (a pinned schema-3 bundle, made before each token's second choice was recorded): a near-tie "
    "is judged by its margin alone, which the server reports"
)
CACHE_ABSENT = (
    "perturbation_cache: absent (a pinned schema-3 bundle, made before the test through the prompt cache): the "
    "perturbation test ran without the server's prompt cache only"
)
LEGACY = (
    "perturbation: the neighbours' own ids rearranged (a pinned schema-3 bundle, made before fresh ids were drawn): "
    "held to their rearrangement, not drawn again"
)


def _margined_answers(b: EndpointBundle) -> list[Completion]:
    """Every answer that asked for margins: the margin passes, the cancel runs, a conversation's cold re-sends."""
    r = b.results
    runs = [lv.cancel for lv in r.levels if lv.cancel is not None]
    passes = [] if r.margins is None else [*r.margins.cold, *r.margins.warm, *r.margins.together,
                                          *(r.margins.sibling or [])]  # fmt: skip
    cold = [] if r.conversations is None else list(r.conversations.cold)
    return [*passes, *(x for run in runs for x in [*run.reference, *run.answers]), *cold]


def check_margins_given(c: Checks, b: EndpointBundle) -> None:
    """A bundle without margin passes is one whose server gave no log-probabilities: then no answer carries any
    (a cancel run's, asked alike, that does contradicts it); and where any answer carries them, every answer asked
    for them with tokens does (stripped from some, those would be judged without margins). Native API only (over an
    OpenAI API a chat answer may come without log-probabilities and is compared by its text)."""
    if not apis.recorded(b.results.endpoint.api).ids:
        return
    asked = [x for x in _margined_answers(b) if x.error is None and x.tokens]
    given = [x.margins is not None for x in asked]
    if b.results.margins is None:
        c.equal(RESULTS, "margins (absent only where the server gives no log-probabilities: no answer has them)",
                False, any(given))  # fmt: skip
    elif asked:
        c.equal(RESULTS, "margins (every answer that asked for them, with tokens, has them)", True, all(given))
    _check_runner_ups(c, b)


def _check_siblings(c: Checks, b: EndpointBundle, ids: list[str], lengths: dict[str, int], new: dict[str, int]) -> None:
    """The sibling pass: the sessions whose prompts start like an earlier one's (recomputed from the recorded prompt
    ids), each once, in order, answered whole with one margin per token; none where no prompt has a sibling."""
    r = b.results
    assert r.margins is not None
    if r.workload.prompt_ids is None:  # (a server that tokenizes nothing: no prompt is known to start like another)
        c.equal(RESULTS, "margins.sibling(s) (none: no prompt's ids are known)", (None, None),
                (r.margins.siblings, r.margins.sibling))  # fmt: skip
        return
    prompt_ids = r.workload.prompt_ids
    if len(prompt_ids) != len(ids):  # (verify.endpoint fails the bundle on it: no siblings to recompute)
        c.equal(RESULTS, "margins.siblings: the prompt ids they come from", len(ids), len(prompt_ids))
        return
    after = margins.siblings(ids, prompt_ids)
    if older(b) and r.margins.sibling is None and r.margins.siblings is None and after:
        c.notes.append(f"margins.sibling: absent, though {len(after)} sessions' prompts start like an earlier one's "
                       "(a pinned schema-3 bundle, made before the sibling pass): unchecked")  # fmt: skip
        return
    c.equal(RESULTS, "margins.siblings (recomputed from the prompt ids)", after or None, r.margins.siblings)
    found = [x.session_id for x in r.margins.sibling or []]
    c.equal(RESULTS, "margins.sibling (each session with a sibling once, in order)", list(after) or None,
            found if r.margins.sibling is not None else None)  # fmt: skip
    for x in r.margins.sibling or []:
        _check_answer(c, b, f"margins.sibling.{x.session_id}", x, lengths, new)


def _check_answer(
    c: Checks, b: EndpointBundle, where: str, x: Completion, lengths: dict[str, int], new: dict[str, int]
) -> None:
    """A margin pass's answer: answered, one margin per token, whole (an unknown id already failed its order
    check)."""
    c.equal(RESULTS, f"{where}: answered", "answered", "answered" if x.error is None else x.error)
    api = b.results.endpoint.api
    margined(c, where, x, api, older(b))
    drawn(c, where, x, bool(b.cfg.engine.temperature) and apis.recorded(api).ids)
    if x.session_id in lengths:
        text = not apis.recorded(api).ids
        whole(c, where, x, lengths[x.session_id], new[x.session_id], b.results.workload.eos, text=text)


def margined(c: Checks, where: str, x: Completion, api: str, old: bool = False) -> None:
    """An answer that asked for margins has one per token: over the native API one per id, and no lengths in bytes;
    over an OpenAI API no ids, and one margin and one length in bytes per token the server says it generated,
    adding up to its text (meshbench.endpoint.stream.text_tokens_whole)."""
    if x.error is not None:
        return
    if apis.recorded(api).ids:
        c.equal(RESULTS, f"{where}: one margin per token", len(x.tokens), len(x.margins or []))
        c.equal(RESULTS, f"{where}.token_bytes (an OpenAI API's only)", None, x.token_bytes)
        if x.runner_up is not None or not old:  # (a pinned schema-3 bundle recorded none: noted once)
            c.equal(RESULTS, f"{where}: one runner-up per token", len(x.tokens), len(x.runner_up or []))
        return
    c.equal(RESULTS, f"{where}.runner_up (the native API's only: a text answer has no ids)", None, x.runner_up)
    c.equal(RESULTS, f"{where}.tokens (none over an OpenAI API)", [], x.tokens)
    c.equal(RESULTS, f"{where}: one margin and one length in bytes per token", len(x.margins or [-1]),
            len(x.token_bytes or []))  # fmt: skip
    c.equal(RESULTS, f"{where}: its tokens are its text", None,
            margins.text_tokens_whole(x.text, x.token_bytes or [], x.predicted))  # fmt: skip


def drawn(c: Checks, where: str, x: Completion, sampled_native: bool) -> None:
    """Every answered margin-pass answer of a sampled sweep over the native API lists each token's candidates after
    the samplers, and no other answer does. Each list as llama-server gives it: one probability per id, each id
    once, sorted best first, adding up to at most 1 (a single candidate: 1), the token drawn among them (top-k's
    every candidate is asked for); and the answer's margin and runner-up per token are the candidates' own (a
    forged list moves them too)."""
    if x.candidates is None and x.candidate_probs is None:
        asked = sampled_native and x.error is None and bool(x.tokens)
        c.equal(RESULTS, f"{where}.candidates (every sampled native margin pass lists them)", False, asked)
        return
    c.equal(RESULTS, f"{where}.candidates (a sampled native margin pass's only)", True, sampled_native)
    ids, probs = x.candidates or [], x.candidate_probs or []
    c.equal(RESULTS, f"{where}: one list of candidates per token", [len(x.tokens)] * 2, [len(ids), len(probs)])
    shaped = all(
        len(i) == len(p) == len(set(i)) > 0
        and math.fsum(p) <= 1 + SUM_SLACK
        and all(u >= v for u, v in zip(p, p[1:]))
        and (len(p) > 1 or abs(p[0] - 1) <= SUM_SLACK)
        and t in i
        for t, i, p in zip(x.tokens, ids, probs)
    )
    c.equal(RESULTS, f"{where}.candidates (sorted, whole, the drawn token among them)", True, shaped)
    if shaped and len(ids) == len(x.tokens) == len(x.margins or []):
        own = [_own(t, i, p) for t, i, p in zip(x.tokens, ids, probs)]
        c.equal(RESULTS, f"{where}: margins and runner-ups (the candidates' own)", [m for m, _ in own],
                list(x.margins or []))  # fmt: skip
        c.equal(RESULTS, f"{where}.runner_up (the candidates' own)", [r for _, r in own], list(x.runner_up or []))


def _own(token: int, ids: list[int], probs: list[float]) -> tuple[float | None, int | None]:
    """A token's margin (top-1 minus top-2 log-probability) and runner-up from its candidates, as the client
    derives them (meshbench.endpoint.native_probs)."""
    ranked = sorted(((i, math.log(p)) for i, p in zip(ids, probs) if p > 0), key=lambda e: -e[1])
    if len(ranked) < 2:
        return None, None
    return round(ranked[0][1] - ranked[1][1], 6), next((i for i, _ in ranked if i != token), None)


def check_perturbation(c: Checks, b: EndpointBundle, lv: EndpointLevel, at: str, ids: list[str]) -> None:
    """The level's test, and its run through the prompt cache exactly where the sweep's requests use the cache:
    see ``_check_test``."""
    if lv.perturbation is None:
        c.equal(RESULTS, f"{at}.perturbation (every native level of C >= 2 has one)", False,
                lv.concurrency > 1 and apis.recorded(b.results.endpoint.api).ids)  # fmt: skip
        return
    _check_test(c, b, lv.perturbation, lv.concurrency, f"{at}.perturbation", ids)
    if older(b) and lv.perturbation_cache is None:
        if b.cfg.engine.cache_prompt != "off" and lv.concurrency > 1 and CACHE_ABSENT not in c.notes:
            c.notes.append(CACHE_ABSENT)
        return
    c.equal(RESULTS, f"{at}.perturbation_cache (exactly where the sweep's requests use the prompt cache)",
            b.cfg.engine.cache_prompt != "off", lv.perturbation_cache is not None)  # fmt: skip
    if lv.perturbation_cache is not None:
        _check_test(c, b, lv.perturbation_cache, lv.concurrency, f"{at}.perturbation_cache", ids)


def check_plans(c: Checks, b: EndpointBundle) -> None:
    """Every test's runs are the ones the sweep draws: which runs were perturbed and each perturbed prompt, drawn
    again from the workload's seed, the tests in level order (perturbation.planned); not merely ids of the
    workload's, which a forger could pick to perturb less than the README says."""
    wl = b.results.workload
    every = [list(x) for x in wl.prompt_ids or []]
    prompts = dict(zip(b.cfg.workload.session_ids(), every))
    tests = [
        (f"levels[{b.results.levels.index(lv)}].{name}.runs", p)
        for lv in sorted(b.results.levels, key=lambda x: x.concurrency)
        for name, p in (("perturbation", lv.perturbation), ("perturbation_cache", lv.perturbation_cache))
        if p is not None
    ]
    if older(b) and perturbation.rearranged([p for _, p in tests], prompts):
        c.notes.append(LEGACY)  # (schema 3 sent each neighbour's own ids rearranged, in every test)
        return
    rng = np.random.default_rng([b.cfg.workload.seed, 1])
    for at, p in tests:
        plan = perturbation.planned(every, [prompts.get(n, []) for n in p.neighbours], rng)
        sent = [(x.perturbed, [list(q) for q in x.neighbour_prompts]) for x in p.runs]
        c.equal(RESULTS, f"{at} (which were perturbed, and with what: drawn again from the seed)", True, sent == plan)


def _check_test(c: Checks, b: EndpointBundle, p: Perturbation, concurrency: int, at: str, ids: list[str]) -> None:
    """One test: its sessions (the first C, split into targets and neighbours), RUNS runs of each kind, the null
    runs sending the neighbours' recorded prompt ids and the perturbed ones other ids of the workload's, every
    target's answer whole, and the verdict recomputed from the targets' answers."""
    wl = b.results.workload
    half = (concurrency + 1) // 2
    c.equal(RESULTS, f"{at}: targets and neighbours (the first C sessions)",
            [ids[:half], ids[half:concurrency]], [p.targets, p.neighbours])  # fmt: skip
    kinds = [x.perturbed for x in p.runs]
    c.equal(RESULTS, f"{at}.runs: {perturbation.RUNS} null and {perturbation.RUNS} perturbed, in order",
            [perturbation.RUNS, perturbation.RUNS, list(range(len(p.runs)))],
            [kinds.count(False), kinds.count(True), [x.run for x in p.runs]])  # fmt: skip
    prompts = dict(zip(ids, wl.prompt_ids or []))
    pool, head = perturbation.id_pool(wl.prompt_ids or []), perturbation.kept(wl.prompt_ids or [])
    lengths, new = dict(zip(ids, wl.prompt_tokens)), dict(zip(ids, wl.new_tokens))
    for x in p.runs:
        where = f"{at}.runs[{x.run}]"
        c.equal(RESULTS, f"{where}: one answer per target", p.targets, [t.session_id for t in x.targets])
        null = [prompts.get(n) for n in p.neighbours]
        sent_ok = (
            len(null) == len(x.neighbour_prompts)
            and all(q is not None for q in null)
            and all(
                perturbation.is_perturbation(q or [], s, pool, head) if x.perturbed else q == s
                for q, s in zip(null, x.neighbour_prompts)
            )
        )
        how = "other ids of the workload's" if x.perturbed else "as they are"
        c.equal(RESULTS, f"{where}: the neighbours' recorded prompts, {how}", True, sent_ok)
        for t in x.targets:  # (eos banned: every token asked for)
            if t.error is None and t.session_id in lengths:
                whole(c, f"{where}.{t.session_id}", t, lengths[t.session_id], new[t.session_id], "ban")
    if len(p.runs) != 2 * perturbation.RUNS:  # (failed above; its exact test is C(runs, runs / 2) relabellings)
        c.equal(RESULTS, f"{at}.verdict (not recomputed: the runs are not the method's)", None, p.verdict)
        return
    c.equal(RESULTS, f"{at}.verdict (recomputed)", perturbation.verdict(p.runs), p.verdict)


def whole(c: Checks, where: str, x: Completion, prompt: int, asked: int, eos: str, text: bool | None = None) -> None:
    """A margin pass's answer as whole as a level's: its stamps in order, the prompt it evaluated, its computed
    tokens at most that, and every asked token unless it stopped at eos (where eos may stop it). ``text``: an
    OpenAI API's answer (default: one with its tokens' lengths in bytes), whose tokens are its margins."""
    stamps = [x.submit_ns, *x.token_ns]
    c.equal(RESULTS, f"{where}.token_ns (in order, after submit_ns)", True, stamps == sorted(stamps))
    text = x.token_bytes is not None if text is None else text  # (no ids, no prompt accounting)
    if not text:
        c.equal(RESULTS, f"{where}: prompt tokens the server evaluated", prompt, x.evaluated)
    c.equal(RESULTS, f"{where}.computed (at most the evaluated)", True, x.computed is None or x.computed <= prompt)
    stopped = x.stop == "eos" and eos == "stop"
    generated = (len(x.margins or []) if text else len(x.tokens)) if x.predicted is None else x.predicted
    tokens = (generated if x.margins is None else len(x.margins)) if text else len(x.tokens)
    c.equal(RESULTS, f"{where}: every token asked for, or an eos stop", True,
            generated == asked or (stopped and generated < asked))  # fmt: skip
    # (a stream may hold back the ids of an incomplete UTF-8 character at its end, as the client allows)
    c.equal(RESULTS, f"{where}.predicted (its tokens, and at most {HOLD_BACK} held back)", True,
            tokens <= generated <= tokens + HOLD_BACK)  # fmt: skip
