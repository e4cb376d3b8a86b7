"""Every answer of a history against its cold answer (meshbench.analysis.endpoint_margins.divergence): where it
first differs, the cold answer's margin and second choice say whether numerics could have flipped it (a near-tie)
or not (confident: a finding). A cancelled request, or one whose answer or cold answer failed, is not judged."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from meshbench.analysis import endpoint_margins as margins
from meshbench.records.completion import Completion
from meshbench.records.history import History, Request
from meshbench.records.hunt import Coverage

SAME, NEAR_TIE, CONFIDENT, UNKNOWN, NOT_JUDGED = "same", "near-tie", "confident", "unknown", "not judged"
OUTCOMES = (SAME, NEAR_TIE, CONFIDENT, UNKNOWN, NOT_JUDGED)
CONFIRM = 3  # a finding's history, and its minimal history, are run again this many times on fresh servers


@dataclass(frozen=True, slots=True, kw_only=True)
class Judged:
    name: str
    outcome: str  # SAME, NEAR_TIE, CONFIDENT, UNKNOWN (no margin where it differs), NOT_JUDGED
    token_index: int | None = None  # where it first differs from its cold answer
    margin: float | None = None  # the cold answer's margin there
    beside: tuple[str, ...] = ()  # the requests sent at once with it
    why: str = ""  # NOT_JUDGED: why


def judge(history: History, answers: dict[str, Completion], cold: dict[str, Completion], limit: float) -> list[Judged]:
    out = []
    for step in history.steps:
        names = [r.name for r in step.requests]
        for r in step.requests:
            x, a = answers.get(r.name), cold.get(r.name)
            beside = tuple(n for n in names if n != r.name)
            why = _unjudged(r.cancel_at, x, a, r.answer_tokens)
            if why:
                out.append(Judged(name=r.name, outcome=NOT_JUDGED, beside=beside, why=why))
                continue
            assert x is not None and a is not None
            d = margins.divergence(len(names), None, r.name, x, a, list(beside), limit)
            if d is None:
                out.append(Judged(name=r.name, outcome=SAME, beside=beside))
            else:
                out.append(
                    Judged(name=r.name, outcome=d.kind, token_index=d.token_index, margin=d.margin, beside=beside)
                )
    return out


def _unjudged(cancel_at: int | None, x: Completion | None, a: Completion | None, n: int) -> str:
    """Why an answer cannot be held to its cold answer (empty: it can): cancelled, failed, not whole (fewer ids
    streamed than asked: llama-server holds back the ids of an incomplete character at the end), or no margins."""
    if cancel_at is not None:
        return "cancelled by its client"
    if x is None or x.error is not None:
        return f"its answer failed ({x.error if x is not None else 'none'})"
    if a is None or a.error is not None:
        return f"its cold answer failed ({a.error if a is not None else 'none'})"
    if len(x.tokens) != n or len(a.tokens) != n:
        return f"not whole ({len(x.tokens)} and {len(a.tokens)} of {n} ids streamed)"
    if a.margins is None or len(a.margins) != n:
        return "its cold answer has no margin per token"
    return ""


def confident(judged: list[Judged]) -> list[Judged]:
    return [j for j in judged if j.outcome == CONFIDENT]


DONOR_MIN = 3  # ids of an answer, from where it differs, that must appear in another request's prompt to name it


def donor(
    answer: Completion, at: int, own: tuple[int, ...], others: Iterable[tuple[str, tuple[int, ...]]]
) -> str | None:
    """The request whose content a differing answer continues: the first of ``others`` whose prompt holds the
    answer's ids from ``at`` on (DONOR_MIN of them at least, or all to the end), where its own prompt does not
    (None: no such request, or the answer continues its own content)."""
    run = tuple(answer.tokens[at : at + 2 * DONOR_MIN])
    if len(run) < DONOR_MIN or _holds(own, run):
        return None
    return next((name for name, prompt in others if _holds(prompt, run)), None)


def _holds(prompt: tuple[int, ...], run: tuple[int, ...]) -> bool:
    n = len(run)
    return any(prompt[k : k + n] == run for k in range(len(prompt) - n + 1))


@dataclass(frozen=True, slots=True)
class Checked:
    """A history as it ran: every request's answer and cold answer (by name), and each judged."""

    history: History
    answers: dict[str, Completion]
    cold: dict[str, Completion]
    judged: list[Judged]


def checked(history: History, answers: dict[str, Completion], cold: dict[str, Completion], limit: float) -> Checked:
    return Checked(history, answers, cold, judge(history, answers, cold, limit))


def shown(runs: list[Checked]) -> int:
    """Of these runs of one history, those with a confident difference."""
    return sum(bool(confident(c.judged)) for c in runs)


def outcomes(runs: list[Checked]) -> dict[str, int]:
    every = [j.outcome for c in runs for j in c.judged]
    return {o: every.count(o) for o in OUTCOMES}


def coverage(runs: list[Checked], head: int) -> dict[str, Coverage]:
    """What the histories exercised, as the server reported it: answers whose prompt it took partly from its cache
    (fewer ids computed than evaluated by more than the ``head`` every prompt starts with), and those ids; by
    strategy."""
    out: dict[str, Coverage] = {}
    for c in runs:
        hits = reused_ids = 0
        for x in c.answers.values():
            reused = (x.evaluated or 0) - (x.computed if x.computed is not None else x.evaluated or 0)
            if x.error is None and reused > head:
                hits += 1
                reused_ids += reused
        was = out.get(c.history.strategy, Coverage(histories=0, requests=0, cache_hits=0, ids_reused=0))
        out[c.history.strategy] = Coverage(
            histories=was.histories + 1,
            requests=was.requests + len(c.answers),
            cache_hits=was.cache_hits + hits,
            ids_reused=was.ids_reused + reused_ids,
        )
    return out


def said(c: Checked, j: Judged) -> str:
    """One confident difference in words: the request, what it carried, where it differs, the cold margin there,
    what was sent beside it, and whose content its answer continues where another request's does."""
    r = next(x for x in c.history.requests() if x.name == j.name)
    others = ((x.name, _read(c, x)) for x in c.history.requests() if x.name != j.name)  # (read as searched)
    answer, at = c.answers[j.name], j.token_index or 0
    src = donor(answer, at, (*r.sent(), *answer.tokens[:at]), others)
    margin = "unknown" if j.margin is None else f"{j.margin:.3g}"
    earlier = [x.name for s in c.history.steps for x in s.requests]
    earlier = earlier[: earlier.index(j.name)]
    where = f"beside {', '.join(j.beside)}" if j.beside else "alone in its step"
    after = f", after {', '.join(earlier[-4:])}" if earlier and not j.beside else ""
    turn = f" (turn {at // r.new_tokens + 1} of {1 + len(r.turns)})" if r.turns else ""
    return (
        f"{j.name} ({r.carries}) first differs from its cold answer at token {j.token_index}{turn}, cold margin "
        f"{margin}, {where}{after}" + (f"; its answer continues {src}'s content" if src else "")
    )


def _read(c: Checked, x: Request) -> tuple[int, ...]:
    """What a request put before the server: its prompt and messages, and a conversation's answers too (its later
    turns sent them back)."""
    answer = c.answers.get(x.name)
    return (*x.sent(), *(answer.tokens if x.turns and answer is not None else ()))
