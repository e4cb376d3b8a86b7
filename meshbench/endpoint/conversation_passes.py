"""The conversations of an endpoint sweep (workload.turns > 1): each session's later user turns, tokenized by the
server, and the cold pass: every later turn of the reference pass sent again alone, with ``cache_prompt`` false,
to compare with its answer in the conversation (meshbench.records.conversation)."""

from __future__ import annotations

from typing import Callable, Sequence

from meshbench.analysis import conversation as talk
from meshbench.analysis import endpoint as figures
from meshbench.analysis import endpoint_margins
from meshbench.endpoint import conversation
from meshbench.endpoint.client import Endpoint
from meshbench.endpoint.load import Job, at_once
from meshbench.endpoint.margin_passes import MARGIN_PROBS, answer
from meshbench.errors import MeshbenchError
from meshbench.records.conversation import ConversationCold
from meshbench.records.margins import MarginPasses
from meshbench.records.model import Completion, EndpointLevel
from meshbench.workload import prompts as prompts_mod
from meshbench.workload import request
from meshbench.workload.config import RunConfig


def later_turns(cfg: RunConfig, endpoint: Endpoint) -> list[conversation.Turns] | None:
    """Each session's later user turns (None for one turn), their ids by the server's tokenizer with nothing
    special added: a turn continues its conversation."""
    wl = cfg.workload
    if wl.turns == 1:
        return None
    if endpoint.api not in conversation.APIS:
        raise MeshbenchError(
            f"workload.turns: conversations run over the native or the chat API, not {endpoint.api} (a text prompt "
            "would tokenize each answer again, not send the conversation as it was): give --api chat"
        )
    path = wl.prompts or ""
    texts = prompts_mod.later_turns(prompts_mod.read_entries(path), wl.turns, path)
    assert texts is not None
    texts = texts[: wl.sessions]
    flat = iter(endpoint.tokenize([t for x in texts for t in x], add_special=False))
    out = [conversation.Turns(tuple(tuple(next(flat)) for _ in x), x) for x in texts]
    empty = [(k, j) for k, x in enumerate(out) for j, ids in enumerate(x.ids) if not ids]
    if empty:
        raise MeshbenchError(
            f"workload.prompts {path}: line {empty[0][0] + 1}'s turn {empty[0][1] + 2} tokenizes to no ids"
        )
    return out


def turn_ids(session_ids: Sequence[str], later: list[conversation.Turns] | None) -> dict[str, list[list[int]]] | None:
    """Each session's later turns' ids, by session (None for one turn)."""
    return None if later is None else {s: [list(x) for x in t.ids] for s, t in zip(session_ids, later)}


def cold_pass(
    endpoint: Endpoint,
    talks: Sequence[Job],
    levels: Sequence[EndpointLevel],
    margins: MarginPasses | None,
    progress: Callable[[str], None],
) -> ConversationCold | None:
    """Every later turn the reference pass (the lowest level's first repetition) answered, sent again alone and
    cold, the same request rebuilt from the pass's answers (meshbench.endpoint.conversation.bodies), with the top-2
    log-probabilities; and the turns whose answer in the conversation differs. They go turn by turn (every
    session's second turn, then every third), so that no request follows its own conversation's last: a server
    that ignores ``cache_prompt`` (llama-cpp-python's) reuses at most a start the sessions share."""
    if not any(j.turns for j in talks):
        return None
    ref = min(levels, key=lambda lv: lv.concurrency)
    rep = ref.repetitions[0]
    progress(f"conversations: every later turn of concurrency {ref.concurrency}'s first pass again, alone and cold")
    by_session: dict[str, list[Completion]] = {}
    for a in figures.pass_answers(rep):
        by_session.setdefault(a.session_id, []).append(a)
    sends = []
    for k, job in enumerate(talks):
        answers = by_session.get(job.session_id, [])
        assert job.turns is not None
        for body, warm in zip(conversation.bodies(endpoint.api, job.body, answers, job.turns), answers[1:]):
            if warm.error is None:
                sends.append(((warm.turn or 1, k), job.session_id, warm.turn, body))
    cold: list[Completion] = []
    for _, sid, turn, body in sorted(sends, key=lambda x: x[0]):  # (turn by turn: none right after its own last)
        x = at_once(
            endpoint, [Job(sid, {**body, "cache_prompt": False, **request.logprobs(endpoint.api, MARGIN_PROBS)})]
        )[0]
        x.turn = turn or 1
        cold.append(answer(x))
    later = rep.turns or []
    compared = figures.compared_by(endpoint.api, [*later, *cold])
    threshold = endpoint_margins.near_tie(margins)
    classify = endpoint_margins.compares(endpoint.api, compared, endpoint.spec.temperature if endpoint.spec else 0.0)
    differing, found = talk.cold_divergences(later, cold, ref.concurrency, threshold, classify)
    return ConversationCold(concurrency=ref.concurrency, cold=cold, differing=differing, divergences=found)
