"""An endpoint bundle checked from its own records: the passes' shape (every session once per repetition, the
level order rotated), every completion's stamps in order, the figures and verdicts recomputed from the stamps
and outputs (meshbench.analysis.endpoint), and the needle's trials."""

from __future__ import annotations

from meshbench.analysis import conversation as talk
from meshbench.analysis import endpoint as figures
from meshbench.analysis import server_accounting as accounting
from meshbench.analysis.checks import Checks
from meshbench.engine import apis, launchers, servers
from meshbench.engine import kinds as engine_kinds
from meshbench.errors import MeshbenchError
from meshbench.names import RESULTS
from meshbench.records import serial
from meshbench.records.completion import CANCELLED
from meshbench.records.model import Completion, EndpointLevel, EndpointRepetition
from meshbench.results.typed import EndpointBundle
from meshbench.verify import endpoint_conversations as conversations
from meshbench.verify import endpoint_proofs as proofs
from meshbench.verify.endpoint_canary import check_canaries
from meshbench.verify.endpoint_cancel import check_cancels
from meshbench.verify.endpoint_gauges import check_gauges
from meshbench.verify.endpoint_open_loop import check_rates
from meshbench.workload import request
from meshbench.workload.target import Target, parse_target


def check_endpoint(c: Checks, b: EndpointBundle) -> None:
    wl, cfg = b.results.workload, b.cfg
    ids = [f"s{i:0{len(str(wl.sessions - 1))}d}" for i in range(wl.sessions)]
    c.equal(RESULTS, "config.engine.kind", engine_kinds.ENDPOINT.name, cfg.engine.kind)
    if not _needle_named(c, b, ids):  # (every check of the needle rests on it: none runs without it)
        return
    c.equal(RESULTS, "workload.sessions (= config.workload.sessions)", cfg.workload.sessions, wl.sessions)
    echo, recorded = cfg.workload.to_dict(), serial.to_json(wl)
    for k in ("prompt_tokens", "new_tokens", "eos", "seed", "prompts"):
        c.equal(RESULTS, f"workload.{k} (= config.workload.{k})", echo[k], recorded[k])
    c.equal(RESULTS, "workload: one prompt length and one new-token count per session", [wl.sessions] * 2,
            [len(wl.prompt_tokens), len(wl.new_tokens)])  # fmt: skip
    typed_levels = b.results.levels
    c.equal(
        RESULTS,
        "levels (= config.levels, ascending)",
        sorted(cfg.levels),
        [lv.concurrency for lv in typed_levels],
    )
    _check_endpoint_record(c, b)
    _check_request(c, b)
    lengths, new = dict(zip(ids, wl.prompt_tokens)), dict(zip(ids, wl.new_tokens))
    slo = cfg.slo
    alone = b.results.needle.alone
    for i, lv in enumerate(typed_levels):
        at = f"levels[{i}]"
        _check_passes(c, lv, at, ids, cfg.repeat, len(typed_levels), i)
        for r, rep in enumerate(lv.repetitions):
            answers = figures.pass_answers(rep)
            by_turn, asked = conversations.lengths(b, answers)
            expected = figures.pass_figures(answers, rep.wall_s, by_turn, slo, asked)
            c.equal(RESULTS, f"{at}.repetitions[{r}].figures (recomputed from the stamps)", expected, rep.figures)
        c.equal(
            RESULTS,
            f"{at}.figures (over the repetitions)",
            figures.summary([rep.figures for rep in lv.repetitions]),
            lv.figures,
        )
        _check_needle(c, lv, at, ids)
    _check_stamps(c, b)
    _check_evaluated(c, b, typed_levels)
    _check_cache_off(c, b)
    _check_answered(c, alone, typed_levels)
    every = [x for lv in typed_levels for rep in lv.repetitions for x in figures.pass_answers(rep)]
    every += [t.completion for lv in typed_levels for t in lv.needle] + [alone]
    compared = figures.compared_by(b.results.endpoint.api, every)
    c.equal(
        RESULTS,
        "verdicts (recomputed from the outputs)",
        figures.verdicts(typed_levels, alone, compared),
        b.results.verdicts,
    )
    c.equal(RESULTS, "conclusions", figures.CONCLUSIONS, b.results.conclusions)
    proofs.check_margins(c, b, ids, compared, lengths, new)
    proofs.check_margins_given(c, b)
    _check_proofs(c, b, ids)
    _check_accounting(c, b)
    check_gauges(c, b)
    check_rates(c, b, ids, lengths, new)
    conversations.check_conversations(c, b, _passes(b))


def _check_proofs(c: Checks, b: EndpointBundle, ids: list[str]) -> None:
    """What every request carried, and the perturbation, canary and cancel-and-retry runs (every bundle of the
    schema this meshbench reads records them all)."""
    wl = b.results.workload
    c.equal(RESULTS, "workload.request (what every request carried: recorded)", True, wl.request is not None)
    if servers.recorded(b.results.endpoint.server).counted:  # (no ids: each length as the server counted it, which
        # every answer that counts its prompt is held to, _check_evaluated; no conversation, which needs them)
        c.equal(RESULTS, "workload.prompt_ids (none: the server tokenizes nothing)", None, wl.prompt_ids)
        c.equal(RESULTS, "workload.turns (one: a conversation needs a tokenizer)", 1, b.cfg.workload.turns)
    else:
        c.equal(RESULTS, "workload.prompt_ids (one list per session, of its length)", list(wl.prompt_tokens),
                [len(x) for x in wl.prompt_ids or []])  # fmt: skip
    for i, lv in enumerate(b.results.levels):
        proofs.check_perturbation(c, b, lv, f"levels[{i}]", ids)
    proofs.check_plans(c, b)
    check_canaries(c, b, ids)
    check_cancels(c, b, ids)


def check_prompt_ids(c: Checks, b: EndpointBundle, here: list[list[int]] | str) -> None:
    """The prompt ids the bundle records, which the server's tokenizer gave and every sibling, margin and canary
    check rests on, are its prompts as the model tokenizes them here (``here``, from meshbench.endpoint.retokenize:
    injected, as checking a file never loads a model); where it could not, why, in a note."""
    if isinstance(here, str):
        c.notes.append(f"workload.prompt_ids: not held to the model's tokenizer here ({here})")
        return
    wl, ids = b.results.workload, b.cfg.workload.session_ids()
    # (then a conversation's later turns, session by session: workload.turn_ids)
    recorded = [*(wl.prompt_ids or []), *(t for x in wl.turn_ids or [] for t in x)]
    names = [*ids, *(f"{s}#t{k + 2}" for s, x in zip(ids, wl.turn_ids or []) for k in range(len(x)))]
    differ = [name for name, mine, theirs in zip(names, here, recorded) if mine != theirs]
    c.equal(
        RESULTS,
        "workload.prompt_ids and turn_ids (= the prompts file as the model here tokenizes them: the sessions and "
        "turns that differ)",
        [] if len(here) == len(recorded) else [f"{len(here)} prompts in the file"],
        differ if len(here) == len(recorded) else [f"{len(recorded)} lists of ids recorded"],
    )


def _check_request(c: Checks, b: EndpointBundle) -> None:
    """What every request carried is what this config sends (recorded since cache_prompt could be chosen). The
    recorded API is one the schema allows (checked before this), so ``request.shared_fields`` asks a real one."""
    wl = b.results.workload
    chosen = request.chosen_cache_prompt(b.cfg.engine.cache_prompt)
    if wl.request is not None or chosen is not None:
        c.equal(
            RESULTS,
            "workload.request (what every request carried, as this config sends it)",
            request.shared_fields(b.results.endpoint.api, wl.eos == "ban", wl.seed, chosen, b.cfg.engine),
            wl.request,
        )


def _check_endpoint_record(c: Checks, b: EndpointBundle) -> None:
    """The endpoint record agrees with the config echo: its url (a served one is on loopback), its api, and
    whether it is on this machine."""
    e, eng = b.results.endpoint, b.cfg.engine
    recorded = _target(e.url)
    c.equal(RESULTS, "endpoint.url (http://HOST:PORT)", True, recorded is not None)
    if recorded is None:
        return
    if eng.url is not None:
        configured = _target(eng.url)
        c.equal(RESULTS, "endpoint.url (= config.engine.url)", configured and configured.url, recorded.url)
    else:
        c.equal(RESULTS, "endpoint.url (a served endpoint is on loopback)", True, recorded.loopback)
    c.equal(RESULTS, "endpoint.loopback (= the url's host)", recorded.loopback, e.loopback)
    if eng.api != apis.AUTO:
        c.equal(RESULTS, "endpoint.api (= config.engine.api)", eng.api, e.api)
    c.equal(RESULTS, f"endpoint.server (a flavour that serves endpoint.api: {e.server!r:.40} serves {e.api!r:.40})",
            True, e.api in servers.recorded(e.server).apis)  # fmt: skip
    c.equal(RESULTS, "endpoint.launched (exactly where config.engine.serve starts a server)", bool(eng.serve),
            e.launched is not None)  # fmt: skip
    launcher = launchers.LAUNCHERS.get(eng.serve) if eng.serve else None  # (the schema allows only theirs)
    if e.launched is not None and launcher is not None:
        argv = eng.server_argv
        c.equal(RESULTS, "endpoint.launched.server (= config.engine.serve)", launcher.name, e.launched.server)
        c.equal(RESULTS, "endpoint.launched.args (meshbench's own flags, then config.engine.server_args)",
                [*launcher.own_flags(argv), *argv], e.launched.args)  # fmt: skip
    named = eng.flavour if eng.flavour != servers.AUTO else launcher.flavour.name if launcher else None
    if named is not None:
        c.equal(RESULTS, "endpoint.server (the flavour config.engine.flavour names, else the one it started)",
                named, e.server)  # fmt: skip
    if e.detected is not None:  # (None: a bundle from before flavours said why)
        why = servers.NAMED if eng.flavour != servers.AUTO else servers.recorded(e.server).why
        c.equal(RESULTS, "endpoint.detected (why the server is its flavour, in that flavour's words)", why, e.detected)


def _target(url: str) -> Target | None:
    try:
        return parse_target(url)
    except MeshbenchError:
        return None


def _needle_named(c: Checks, b: EndpointBundle, ids: list[str]) -> bool:
    """The needle is the first session's prompt, as the sweep sends it."""
    named = b.results.needle.prompt_of in ids[:1]
    if not named:
        c.equal(RESULTS, "needle.prompt_of (the first session's prompt)", ids[0] if ids else None,
                b.results.needle.prompt_of)  # fmt: skip
    return named


def _check_passes(c: Checks, lv: EndpointLevel, at: str, ids: list[str], repeat: int, count: int, index: int) -> None:
    """Each repetition answers every session once, in order; repetition r ran this level at its place in the
    order rotated by r."""
    c.equal(RESULTS, f"{at}.repetitions (count = config.repeat)", repeat, len(lv.repetitions))
    for r, rep in enumerate(lv.repetitions):
        c.equal(RESULTS, f"{at}.repetitions[{r}].repetition", r, rep.repetition)
        c.equal(
            RESULTS,
            f"{at}.repetitions[{r}].sessions (every session once, in order)",
            ids,
            [x.session_id for x in rep.sessions],
        )
        rotated = list(range(r % count, count)) + list(range(r % count))
        c.equal(
            RESULTS, f"{at}.repetitions[{r}].position (level order rotated by r)", rotated.index(index), rep.position
        )
        most = most_in_flight(figures.pass_answers(rep))
        c.equal(RESULTS, f"{at}.repetitions[{r}]: at most C = {lv.concurrency} requests in flight (closed loop, by "
                "the stamps)", True, most <= lv.concurrency)  # fmt: skip


def most_in_flight(answers: list[Completion]) -> int:
    """The most requests in flight at once, each from its submission to its last token (an answer with none: its
    submission alone). A closed-loop client sends its next request after its last answer's last token, so C
    clients never have more than C: a pass shifted to overlap more was not run so."""
    events = []
    for x in answers:
        end = x.token_ns[-1] if x.token_ns else x.submit_ns
        events += [(x.submit_ns, 1), (end, -1)]
    most = now = 0
    for _, step in sorted(events, key=lambda e: (e[0], e[1])):  # (an end before a start at the same instant)
        now += step
        most = max(most, now)
    return most


def _check_needle(c: Checks, lv: EndpointLevel, at: str, ids: list[str]) -> None:
    c.equal(RESULTS, f"{at}.needle (one trial per repetition)", len(lv.repetitions), len(lv.needle))
    for k, t in enumerate(lv.needle):
        where = f"{at}.needle[{k}]"
        c.equal(
            RESULTS,
            f"{where}.neighbours (C - 1 distinct other sessions)",
            True,
            len(t.neighbours) == min(lv.concurrency - 1, len(ids) - 1)
            and len(set(t.neighbours)) == len(t.neighbours)
            and all(n in ids[1:] for n in t.neighbours),
        )
        c.equal(RESULTS, f"{where}.position (among its neighbours)", True, 0 <= t.position <= len(t.neighbours))
        c.equal(RESULTS, f"{where}.completion.session_id", "needle", t.completion.session_id)
        stamps = [t.completion.submit_ns, *t.completion.token_ns]
        c.equal(RESULTS, f"{where}.completion.token_ns (in order, after submit_ns)", True, stamps == sorted(stamps))


def _passes(b: EndpointBundle) -> list[tuple[str, EndpointRepetition]]:
    """Every timed pass, where it is: the levels' repetitions, then the open-loop passes'."""
    out = [
        (f"levels[{i}].repetitions[{r}]", rep)
        for i, lv in enumerate(b.results.levels)
        for r, rep in enumerate(lv.repetitions)
    ]
    out += [
        (f"rates[{k}].repetitions[{r}]", rep)
        for k, x in enumerate(b.results.rates or ())
        for r, rep in enumerate(x.repetitions)
    ]
    return out


def _check_stamps(c: Checks, b: EndpointBundle) -> None:
    """Every completion's token stamps never decrease and come after its submission; a native answer has one
    stamp per token id."""
    native = apis.recorded(b.results.endpoint.api).ids
    for at, rep in _passes(b):
        for x in figures.pass_answers(rep):
            where = f"{at}.{talk.label(x)}"
            stamps = x.token_ns
            c.equal(
                RESULTS,
                f"{where}.token_ns (in order, after submit_ns)",
                True,
                all(a <= b for a, b in zip([x.submit_ns, *stamps], stamps)),
            )
            if native:
                c.equal(RESULTS, f"{where}: one stamp per token id", len(x.tokens), len(stamps))
            if x.stop == CANCELLED:  # (only a cancel run's clients disconnect)
                c.equal(RESULTS, f"{where}: read to its end (a timed pass cancels nothing)", "read", x.stop)
            c.equal(
                RESULTS,
                f"{where}: within the pass's wall time",
                True,
                not stamps or stamps[-1] <= rep.wall_s * 1e9 + 1e6,
            )


def _check_answered(c: Checks, alone: Completion, levels: list[EndpointLevel]) -> None:
    """Every request was answered: a failed one has no output for a verdict to judge (as a node's session may
    fail only by an injected fault)."""
    c.equal(RESULTS, "needle.alone: answered", "answered", "answered" if alone.error is None else alone.error)
    for i, lv in enumerate(levels):
        for r, rep in enumerate(lv.repetitions):
            for x in figures.pass_answers(rep):
                if x.error is not None:
                    c.equal(RESULTS, f"levels[{i}].repetitions[{r}].{talk.label(x)}: answered", "answered", x.error)
        for k, t in enumerate(lv.needle):
            if t.completion.error is not None:
                c.equal(RESULTS, f"levels[{i}].needle[{k}]: answered", "answered", t.completion.error)


def _check_cache_off(c: Checks, b: EndpointBundle) -> None:
    """Where every request sent ``cache_prompt`` false (engine.cache_prompt off), the server took nothing from its
    prompt cache: each timed answer that says what it computed computed every prompt token it evaluated (an echo
    saying off beside answers served from the cache claims a setting the records contradict)."""
    if b.cfg.engine.cache_prompt != "off":
        return
    for at, rep in _passes(b):
        for x in figures.pass_answers(rep):
            if x.computed is not None and x.evaluated is not None:
                c.equal(RESULTS, f"{at} {talk.label(x)}: every prompt token computed (cache_prompt false)",
                        x.evaluated, x.computed)  # fmt: skip


def _check_evaluated(c: Checks, b: EndpointBundle, levels: list[EndpointLevel]) -> None:
    """Where the server says how many prompt tokens it evaluated, it evaluated exactly the session's prompt (no
    BOS added to ids; a conversation's later turn: the conversation so far)."""
    first = b.results.needle.prompt_of
    lengths = dict(zip(b.cfg.workload.session_ids(), b.results.workload.prompt_tokens))
    answers = [(f"levels[{i}]", t.completion, lengths) for i, lv in enumerate(levels) for t in lv.needle]
    for at, rep in _passes(b):
        by_turn, _ = conversations.lengths(b, figures.pass_answers(rep))
        answers += [(at, x, by_turn) for x in figures.pass_answers(rep)]
    for at, x, known in answers:
        if x.evaluated is not None:
            name = first if x.session_id == "needle" else talk.label(x)
            c.equal(RESULTS, f"{at} {talk.label(x)}: prompt tokens the server evaluated", known[name], x.evaluated)


def _check_accounting(c: Checks, b: EndpointBundle) -> None:
    """Every answer's prompt accounting is whole (computed at most evaluated; margins only in the margin passes),
    and on a server meshbench started (no other client) the server's counters moved over each pass by exactly
    what its answers say: tokens predicted, prompt tokens computed and taken from the cache."""
    own = b.results.endpoint.launched is not None
    for at, rep in _passes(b):
        every = figures.pass_answers(rep)
        for x in every:
            _whole_accounting(c, f"{at}.{talk.label(x)}", x)
        moved = accounting.pass_accounting(rep.metrics_before, rep.metrics_after)
        answers = [x for x in every if x.error is None]
        if not own or len(answers) < len(every) or any(x.computed is None for x in answers):
            continue
        said = {
            "tokens predicted": sum(x.predicted or 0 for x in answers),
            "prompt tokens computed": sum(x.computed or 0 for x in answers),
            "prompt tokens from the cache": sum((x.evaluated or 0) - (x.computed or 0) for x in answers),
        }
        for name, total in said.items():
            if moved[name] is not None:
                c.equal(RESULTS, f"{at}: the server's {name} over the pass (= its answers')", total, moved[name])


def _whole_accounting(c: Checks, where: str, x: Completion) -> None:
    if x.computed is not None:
        whole = x.evaluated is not None and x.computed <= x.evaluated
        c.equal(RESULTS, f"{where}.computed (at most the evaluated)", True, whole)
    c.equal(RESULTS, f"{where}.margins (asked only in the margin passes)", None, x.margins)
    c.equal(RESULTS, f"{where}.candidates (asked only in the margin passes)", None, x.candidates)
