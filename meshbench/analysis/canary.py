"""Canaries: a unique code planted in a session's prompt, searched for in every other answer.

At each level the first C sessions are sent at once, each prompt its own code repeated (``REPEATS`` times: a
model continues a repeated string, so its own answer shows the code, and an answer that sees another's prompt
shows that one's). Every answer the sweep recorded, in every pass, is then searched for every code planted but
the one its own request carried, in its text and (where ids are compared) in its token ids. The codes are drawn
at random from an alphabet a tokenizer splits into several pieces, so no model writes one by chance: a hit is a
proven leak, and it names the session that carried the code and the one whose answer holds it. An answer is
searched only for the codes sent before or beside it (the sweep's order is fixed: its timed passes come first).

No hit means no more than that no code crossed where a model would show it: the search has power only where
sessions repeat their own code (``echoed``), and a leak that puts another's ids where the model does not continue
them (the start of a prompt, say) need not surface; the perturbation test looks there. It is judged only where
every canary answer came back and every level of two or more sessions echoed at least one code.
"""

from __future__ import annotations

from typing import Iterator, Sequence

import numpy as np

from meshbench.records.canary import CanaryHit, CanaryRun, CanarySearch
from meshbench.records.completion import Completion
from meshbench.records.margins import MarginPasses
from meshbench.records.model import EndpointLevel
from meshbench.records.open_loop import EndpointRate

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


def ids_usable(ids: Sequence[Sequence[int]]) -> bool:
    """Are the codes' ids (every code of the sweep) fit to search by: none empty, no two alike? A tokenizer that
    gives two codes the same ids (or none) would make an ids hit ambiguous: then only text is searched."""
    keys = [tuple(i) for i in ids]
    return all(keys) and len(set(keys)) == len(keys)


def open_loop_answers(rates: Sequence[EndpointRate] | None) -> list[tuple[str, Completion]]:
    """The open-loop passes' answers, each where it is, in the order they were sent."""
    return [
        (f"{x.rate:g}/s repetition {rep.repetition}", a)
        for x in rates or ()
        for rep in x.repetitions
        for a in rep.sessions
    ]


def holds(answer: Completion, code: str, ids: Sequence[int], use_ids: bool = True) -> list[str]:
    """How ``answer`` holds ``code``: in its text, in its token ids (``ids``, the code as the server tokenizes
    it mid-prompt, where ``use_ids``), both, or neither."""
    by = ["text"] if code in answer.text else []
    if use_ids and ids and contains(answer.tokens, ids):
        by.append("ids")
    return by


def contains(seq: Sequence[int], sub: Sequence[int]) -> bool:
    """Does ``sub`` occur in ``seq`` as a run? (A substring search over their decimal forms: linear, not
    len(seq) x len(sub).)"""
    return bool(sub) and _joined(sub) in _joined(seq)


def _joined(ids: Sequence[int]) -> str:
    return "," + ",".join(map(str, ids)) + ","


def echoed(
    sessions: Sequence[str],
    codes: Sequence[str],
    ids: Sequence[Sequence[int]],
    answers: Sequence[Completion],
    use_ids: bool,
) -> list[str]:
    """The sessions whose answer repeated their own code."""
    return [s for s, code, i, a in zip(sessions, codes, ids, answers) if a.error is None and holds(a, code, i, use_ids)]


Planted = tuple[int, str]  # (level, session): whose code


def answers(
    levels: Sequence[EndpointLevel],
    margins: MarginPasses | None,
    alone: Completion,
    later: Sequence[tuple[str, Completion]] = (),
) -> Iterator[tuple[str, Completion, Planted | None, list[Planted]]]:
    """Every answer the sweep recorded, in the order the sweep sends them (the needle alone, the margin passes,
    every repetition and needle trial; then level by level its perturbation, canary and cancel runs): where it
    is, the answer, the code its own request carried (None: none), and the codes sent before or beside it (the
    ones it could hold)."""
    yield "needle alone", alone, None, []
    if margins is not None:
        sides = (("cold", margins.cold), ("warm", margins.warm), ("together", margins.together))
        for side, xs in (*sides, ("after a sibling", margins.sibling or [])):
            for x in xs:
                yield f"margins {side}", x, None, []
    for lv in levels:
        for rep in lv.repetitions:
            for x in [*rep.sessions, *(rep.turns or ())]:  # (a conversation's later turns too)
                yield f"C={lv.concurrency} repetition {rep.repetition}", x, None, []
        for t in lv.needle:
            yield f"C={lv.concurrency} needle trial {t.repetition}", t.completion, None, []
    sent: list[Planted] = []
    for lv in levels:
        c = lv.concurrency
        if lv.perturbation is not None:
            for run in lv.perturbation.runs:
                for x in run.targets:
                    yield f"C={c} perturbation run {run.run}", x, None, list(sent)
        if lv.canary is not None:
            sent += [(c, s) for s in lv.canary.sessions]
            for x in lv.canary.answers:
                yield f"C={c} canary run", x, (c, x.session_id), list(sent)
        if lv.cancel is not None:
            for side, xs in (("reference", lv.cancel.reference), ("cut", lv.cancel.cut), ("run", lv.cancel.answers)):
                for x in xs:
                    yield f"C={c} cancel {side}", x, None, list(sent)
    for where, x in later:  # (the open-loop passes: after every level's runs)
        yield where, x, None, list(sent)


def search(
    levels: Sequence[EndpointLevel],
    margins: MarginPasses | None,
    alone: Completion,
    later: Sequence[tuple[str, Completion]] = (),
) -> CanarySearch | None:
    """Every answer searched for every code sent before or beside it but its own (None: no level planted any);
    ``later``: answers sent after every level's runs (the open-loop passes'), each where it is."""
    runs = [(lv.concurrency, lv.canary) for lv in levels if lv.canary is not None]
    if not runs:
        return None
    codes = {(c, s): (code, ids) for c, run in runs for s, code, ids in zip(run.sessions, run.canaries, run.canary_ids)}
    use_ids = ids_usable([ids for _, ids in codes.values()])
    hits, searched = [], 0
    for where, x, own, sent in answers(levels, margins, alone, later):
        carriers = [p for p in sent if p != own]
        searched += bool(carriers)
        for c, s in carriers:
            code, ids = codes[(c, s)]
            by = holds(x, code, ids, use_ids)
            if by:
                hits.append(
                    CanaryHit(canary=code, carrier=s, carrier_level=c, receiver=x.session_id, where=where, by=by)
                )
    failed = sum(x.error is not None for _, run in runs for x in run.answers)
    deaf = [c for c, run in runs if c > 1 and not run.echoed]  # levels where no session repeated its own code
    judged = failed == 0 and not deaf and any(c > 1 for c, _ in runs)
    return CanarySearch(
        planted=len(codes),
        echoed=sum(len(run.echoed) for _, run in runs),
        searched=searched,
        failed=failed,
        hits=hits,
        leak=True if hits else (False if judged else None),
    )


def run_record(
    sessions: list[str],
    codes: list[str],
    ids: list[list[int]],
    prompts: list[list[int]],
    done: list[Completion],
    use_ids: bool,
) -> CanaryRun:
    """A level's canary run as results.json holds it (``use_ids``: the sweep's codes' ids are fit to search by)."""
    return CanaryRun(
        sessions=sessions,
        canaries=codes,
        canary_ids=ids,
        prompts=prompts,
        answers=done,
        echoed=echoed(sessions, codes, ids, done, use_ids),
    )
