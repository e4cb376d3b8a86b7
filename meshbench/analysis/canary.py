"""Canaries: a unique code planted in a session's prompt, searched for in every other answer.

At each level the first C sessions are sent at once, each prompt its own code repeated (``REPEATS`` times: a
model continues a repeated string, so its own answer shows the code, and an answer that sees another's prompt
shows that one's). Every answer the sweep recorded, in every pass, is then searched for every code planted but
the one its own request carried, in its text and (where ids are compared) in its token ids. The codes are drawn
at random from an alphabet a tokenizer splits into several pieces, so no model writes one by chance: a hit is a
proven leak, and it names the session that carried the code and the one whose answer holds it. No hit means no
more than that no code crossed: the search has power only where sessions repeat their own code (``echoed``).
"""

from __future__ import annotations

from typing import Iterator, Sequence

import numpy as np

from meshbench.records.canary import CanaryHit, CanaryRun, CanarySearch
from meshbench.records.completion import Completion
from meshbench.records.margins import MarginPasses
from meshbench.records.model import EndpointLevel

ALPHABET = "ABCDEFGHJKLMNPQRSTUVWXYZ23456789"  # (no I, O, 0, 1: nothing a model writes for a word)
LENGTH = 8
REPEATS = 8


def canaries(seed: int, levels: Sequence[int]) -> dict[int, list[str]]:
    """Each level's codes, one per session of its canary run (the first C), all distinct across the sweep."""
    rng = np.random.default_rng([seed, 0xCA, 0x4A])
    seen: set[str] = set()
    out: dict[int, list[str]] = {}
    for c in sorted(levels):
        codes: list[str] = []
        while len(codes) < c:
            code = "".join(ALPHABET[int(k)] for k in rng.integers(0, len(ALPHABET), LENGTH))
            if code not in seen:
                seen.add(code)
                codes.append(code)
        out[c] = codes
    return out


def prompt_text(code: str) -> str:
    """The prompt that carries ``code``: the code, repeated."""
    return " ".join([code] * REPEATS)


def holds(answer: Completion, code: str, ids: Sequence[int]) -> list[str]:
    """How ``answer`` holds ``code``: in its text, in its token ids (``ids``, the code as the server tokenizes
    it mid-prompt), both, or neither."""
    by = ["text"] if code in answer.text else []
    if ids and _contains(answer.tokens, ids):
        by.append("ids")
    return by


def _contains(seq: Sequence[int], sub: Sequence[int]) -> bool:
    n = len(sub)
    return any(list(seq[i : i + n]) == list(sub) for i in range(len(seq) - n + 1))


def echoed(
    sessions: Sequence[str], codes: Sequence[str], ids: Sequence[Sequence[int]], answers: Sequence[Completion]
) -> list[str]:
    """The sessions whose answer repeated their own code."""
    return [s for s, code, i, a in zip(sessions, codes, ids, answers) if a.error is None and holds(a, code, i)]


def answers(
    levels: Sequence[EndpointLevel], margins: MarginPasses | None, alone: Completion
) -> Iterator[tuple[str, Completion, tuple[int, str] | None]]:
    """Every answer the sweep recorded: where it is, the answer, and the (level, session) whose code its own
    request carried (None: it carried none)."""
    yield "needle alone", alone, None
    if margins is not None:
        for side, xs in (("cold", margins.cold), ("warm", margins.warm), ("together", margins.together)):
            for x in xs:
                yield f"margins {side}", x, None
    for lv in levels:
        c = lv.concurrency
        for rep in lv.repetitions:
            for x in rep.sessions:
                yield f"C={c} repetition {rep.repetition}", x, None
        for t in lv.needle:
            yield f"C={c} needle trial {t.repetition}", t.completion, None
        if lv.perturbation is not None:
            for run in lv.perturbation.runs:
                for x in run.targets:
                    yield f"C={c} perturbation run {run.run}", x, None
        if lv.canary is not None:
            for x in lv.canary.answers:
                yield f"C={c} canary run", x, (c, x.session_id)


def search(levels: Sequence[EndpointLevel], margins: MarginPasses | None, alone: Completion) -> CanarySearch | None:
    """Every answer searched for every code planted but its own (None: no level planted any)."""
    runs = [(lv.concurrency, lv.canary) for lv in levels if lv.canary is not None]
    if not runs:
        return None
    planted = [(c, s, code, ids) for c, run in runs for s, code, ids in zip(run.sessions, run.canaries, run.canary_ids)]
    hits, searched = [], 0
    for where, x, own in answers(levels, margins, alone):
        searched += 1
        for c, s, code, ids in planted:
            by = holds(x, code, ids) if (c, s) != own else []
            if by:
                hits.append(
                    CanaryHit(canary=code, carrier=s, carrier_level=c, receiver=x.session_id, where=where, by=by)
                )
    echo = sum(len(run.echoed) for _, run in runs)
    return CanarySearch(
        planted=len(planted),
        echoed=echo,
        searched=searched,
        hits=hits,
        leak=True if hits else (False if echo else None),
    )


def run_record(
    sessions: list[str],
    codes: list[str],
    ids: list[list[int]],
    prompts: list[list[int]],
    done: list[Completion],
) -> CanaryRun:
    """A level's canary run as results.json holds it."""
    return CanaryRun(
        sessions=sessions,
        canaries=codes,
        canary_ids=ids,
        prompts=prompts,
        answers=done,
        echoed=echoed(sessions, codes, ids, done),
    )
