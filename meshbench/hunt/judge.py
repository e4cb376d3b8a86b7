"""Every answer of a history against its cold answer (meshbench.analysis.endpoint_margins.divergence): where it
first differs, the cold answer's margin and second choice say whether numerics could have flipped it (a near-tie)
or not (confident: a finding). A cancelled request, or one whose answer or cold answer failed, is not judged."""

from __future__ import annotations

from dataclasses import dataclass

from meshbench.analysis import endpoint_margins as margins
from meshbench.hunt.history import History
from meshbench.records.completion import Completion

SAME, NEAR_TIE, CONFIDENT, UNKNOWN, NOT_JUDGED = "same", "near-tie", "confident", "unknown", "not judged"


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
            why = _unjudged(r.cancel_at, x, a)
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


def _unjudged(cancel_at: int | None, x: Completion | None, a: Completion | None) -> str:
    if cancel_at is not None:
        return "cancelled by its client"
    if x is None or x.error is not None:
        return f"its answer failed ({x.error if x is not None else 'none'})"
    if a is None or a.error is not None:
        return f"its cold answer failed ({a.error if a is not None else 'none'})"
    if a.margins is None:
        return "its cold answer has no margins"
    return ""


def confident(judged: list[Judged]) -> list[Judged]:
    return [j for j in judged if j.outcome == CONFIDENT]


DONOR_MIN = 3  # ids of an answer, from where it differs, that must appear in another request's prompt to name it


def donor(answer: Completion, at: int, own: tuple[int, ...], others: dict[str, tuple[int, ...]]) -> str | None:
    """The request whose content a differing answer continues: the first of ``others`` whose prompt holds the
    answer's ids from ``at`` on (DONOR_MIN of them at least, or all to the end), where its own prompt does not
    (None: no such request, or the answer continues its own content)."""
    run = tuple(answer.tokens[at : at + 2 * DONOR_MIN])
    if len(run) < DONOR_MIN or _holds(own, run):
        return None
    return next((name for name, prompt in others.items() if _holds(prompt, run)), None)


def _holds(prompt: tuple[int, ...], run: tuple[int, ...]) -> bool:
    n = len(run)
    return any(prompt[k : k + n] == run for k in range(len(prompt) - n + 1))
