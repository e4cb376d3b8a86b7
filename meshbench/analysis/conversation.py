"""A conversation's turns over HTTP, as the figures and verdicts count them: each turn's name (``s0`` for a
session's first turn, ``s0#t2`` for its second), its prompt's length (the conversation so far), and the later
turns whose answer in the conversation differs from the same request sent again cold
(meshbench.records.conversation)."""

from __future__ import annotations

from typing import Sequence

from meshbench.analysis.endpoint_margins import divergence
from meshbench.engine import apis
from meshbench.records.completion import Completion
from meshbench.records.margins import Divergence


def label(c: Completion) -> str:
    """A turn's name: its session's id for a first turn, ``<session>#t<turn>`` for a later one."""
    return c.session_id if c.turn is None else f"{c.session_id}#t{c.turn}"


def unsendable(api: str, c: Completion) -> str | None:
    """Why a conversation cannot go on after answer ``c`` as it was generated (None: it can): over the native API
    the next prompt carries the answer's ids, and a stream that held back the ids of its last tokens (an
    incomplete UTF-8 character at its end) did not give them all."""
    if apis.recorded(api).ids and c.predicted is not None and c.predicted > len(c.tokens):
        return (
            f"not sent: the server generated {c.predicted} tokens in the turn before and streamed the ids of "
            f"{len(c.tokens)} (it held back an incomplete character's): the conversation cannot go on as generated"
        )
    return None


def generated(c: Completion) -> int:
    """The tokens an answer put into its conversation: its ids (native), else what the server says it generated
    (its streamed pieces where it does not say)."""
    if c.tokens:
        return len(c.tokens)
    return c.predicted if c.predicted is not None else len(c.token_ns)


def prompt_lengths(
    first: dict[str, int], turn_ids: dict[str, list[list[int]]] | None, answers: Sequence[Completion]
) -> dict[str, int]:
    """Each answer's prompt length by its name: a first turn's is its session's (``first``); a later turn's is the
    turn before it, that turn's answer and the user's new turn (``turn_ids``). ``answers`` hold each conversation's
    turns in order (a pass's first turns, then its later ones)."""
    out = {}
    last: dict[str, Completion] = {}
    for c in sorted(answers, key=lambda x: x.turn or 1):
        if c.turn is None or turn_ids is None or c.session_id not in last:
            out[label(c)] = first.get(c.session_id, 0)
        else:
            before = last[c.session_id]
            ids = turn_ids.get(c.session_id, [])
            added = len(ids[c.turn - 2]) if c.turn - 2 < len(ids) else 0
            out[label(c)] = out[label(before)] + generated(before) + added
        last[c.session_id] = c
    return out


def new_tokens(new: dict[str, int], answers: Sequence[Completion]) -> dict[str, int]:
    """Each answer's asked-for new tokens by its name (every turn asks for its session's)."""
    return {label(c): new.get(c.session_id, 0) for c in answers}


def cold_divergences(
    warm: Sequence[Completion], cold: Sequence[Completion], concurrency: int, threshold: float, classify: bool
) -> tuple[list[str], list[Divergence] | None]:
    """The later turns whose answer in the conversation (``warm``) differs from the same request sent cold, by
    name; where ``classify`` (meshbench.analysis.endpoint_margins.compares), where each first differs, classified
    by the cold answer's margin there; else by text alone."""
    by_name = {label(c): c for c in cold if c.error is None}
    differing, found = [], []
    for x in warm:
        a = by_name.get(label(x))
        if x.error is not None or a is None:
            continue
        if classify:
            d = divergence(concurrency, 0, label(x), x, a, [], threshold)
            if d is not None:
                differing.append(label(x))
                found.append(d)
        elif x.text != a.text:
            differing.append(label(x))
    return differing, found if classify else None
