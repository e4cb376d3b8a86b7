"""The margin passes of an endpoint sweep: every session with the server's top-2 log-probabilities per token,
outside the timed passes (meshbench.analysis.endpoint_margins judges them)."""

from __future__ import annotations

from typing import Callable

from meshbench.analysis import endpoint_margins
from meshbench.endpoint import client
from meshbench.endpoint.client import Endpoint
from meshbench.endpoint.load import Job, at_once
from meshbench.engine import apis
from meshbench.records import serial
from meshbench.records.margins import MarginPasses
from meshbench.records.model import Completion
from meshbench.workload import request

MARGIN_PROBS = 2  # the top log-probabilities asked for per token in the margin passes
DRAWN_PROBS = request.DRAW_TOP_K  # sampled over the native API: every candidate top-k leaves, after the samplers


def run(
    endpoint: Endpoint, jobs: list[Job], ids: list[list[int]], progress: Callable[[str], None]
) -> MarginPasses | None:
    """Every session with the server's top-2 log-probabilities per token (meshbench.workload.request.logprobs),
    outside the timed passes (asking for them costs the server a softmax and a sort per token): alone and cold
    (``cache_prompt`` false), alone again as the sweep sends it (warm: right after itself), then all at once; then
    each session whose prompt starts like an earlier one's right after that sibling (``ids``: the prompts' ids).
    Over an OpenAI API each answer also records its tokens' lengths in bytes, which place a text's first
    difference at a token."""
    if endpoint.flavour is not None and not endpoint.flavour.logprobs:
        progress(f"margins: a {endpoint.flavour.name} server gives no log-probabilities: no margin passes")
        return None
    drawn = bool(endpoint.spec and endpoint.spec.temperature) and endpoint.api == apis.NATIVE.name
    if drawn:
        progress(f"margins: every session cold, warm, all at once, then after a sibling, with its top {DRAWN_PROBS} "
                 "candidates after the samplers (where each draw fell)")  # fmt: skip
        probs = request.drawn_probs(DRAWN_PROBS)
    else:
        progress("margins: every session cold, warm, all at once, then after a sibling, with top-2 log-probabilities")
        probs = request.logprobs(endpoint.api, MARGIN_PROBS)
    asked = [Job(j.session_id, {**j.body, **probs}) for j in jobs]
    cold, warm = [], []
    for j in asked:
        cold.append(answer(at_once(endpoint, [Job(j.session_id, {**j.body, "cache_prompt": False})])[0]))
        warm.append(answer(at_once(endpoint, [j])[0]))
    together = [answer(x) for x in at_once(endpoint, asked)]
    after = endpoint_margins.siblings([j.session_id for j in jobs], ids)
    sibling = []
    by_id = {j.session_id: j for j in jobs}
    for j in asked:  # each session right after its sibling (the sibling as the sweep sends it)
        if j.session_id in after:
            progress(f"margins: {j.session_id} right after {after[j.session_id]}, which shares its prompt's start")
            at_once(endpoint, [by_id[after[j.session_id]]])
            sibling.append(answer(at_once(endpoint, [j])[0]))
    if any(x.margins is None and (x.tokens or x.text) for x in [*cold, *warm, *together, *sibling]):
        progress("margins: the server gives no log-probabilities: none recorded")
        return None
    if not after:
        return MarginPasses(cold=cold, warm=warm, together=together)
    return MarginPasses(cold=cold, warm=warm, together=together, sibling=sibling, siblings=after)


def answer(x: client.Completion) -> Completion:
    """The client's answer (filled while it streamed) as the record results.json holds."""
    return serial.completion(x.to_dict())
