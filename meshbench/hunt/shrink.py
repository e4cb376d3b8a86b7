"""A finding's history made smaller while it still reproduces, the way Hypothesis shrinks a failing example:
greedy passes that each try one smaller history (a step dropped, a request dropped, a step's requests sent one
after another, a prompt cut, an answer shortened) and keep it where ``still`` says the finding is there, until no
pass shrinks it or the tries run out. ``still`` runs the history on a fresh server and judges it."""

from __future__ import annotations

import dataclasses
import time
from typing import Callable, Iterable, Iterator, Protocol

from meshbench.records.history import History, Request, Step

MAX_TRIES = 40  # candidate histories run at most
SHOWS = 2  # fresh runs running that must show a smaller history's difference for the shrink to keep it


def shrink(
    history: History,
    still: Callable[[History], bool],
    head: int,
    tries: int = MAX_TRIES,
    progress: Callable[[str], None] = lambda m: None,
    deadline: float | None = None,
    used: list[int] | None = None,
) -> History:
    """The smallest history found that ``still`` holds for (``history`` itself where none is); ``head``: the ids
    every prompt starts with, never cut; ``progress`` hears each try and whether it was kept. A candidate already
    tried and not kept is not run again (after each kept one the passes start over, and most of their first cuts
    were tried before: for one planted fault, 18 of 40 tries were such repeats). Past ``deadline`` (the monotonic
    clock) no candidate is tried: the smallest found so far is the shrink's. ``used``, where given, hears how many
    candidates were run (a rerun gives the same shrink that many tries, and no deadline)."""
    best, left = history, tries
    rejected: set[tuple[Step, ...]] = set()
    changed = True
    while changed and left > 0:
        changed = False
        for candidate in _candidates(best, head):
            if deadline is not None and time.monotonic() >= deadline:
                progress(f"shrink stopped after {tries - left} tries: its time is spent")
                if used is not None:
                    used.append(tries - left)
                return best
            if left <= 0:
                break
            if candidate.steps in rejected:
                continue
            left -= 1
            kept = still(candidate)
            if not kept:
                rejected.add(candidate.steps)
            steps, reqs, ids = candidate.size()
            answers = sum(r.answer_tokens for r in candidate.requests())
            progress(f"shrink try {tries - left}: {steps} steps, {reqs} requests, {ids} prompt ids, {answers} answer "
                     f"tokens: {'kept' if kept else 'not shown'}")  # fmt: skip
            if kept:
                best, changed = candidate, True
                break
    if used is not None:
        used.append(tries - left)
    return best


def _candidates(h: History, head: int) -> Iterator[History]:
    """Smaller histories, biggest cuts first."""
    steps = list(h.steps)
    for k in range(len(steps)):
        if len(steps) > 1:
            yield _with(h, steps[:k] + steps[k + 1 :])
    for k, s in enumerate(steps):
        if len(s.requests) > 1:
            for j in range(len(s.requests)):
                yield _with(h, [*steps[:k], Step(requests=s.requests[:j] + s.requests[j + 1 :]), *steps[k + 1 :]])
            alone = [Step(requests=(r,)) for r in s.requests]
            yield _with(h, [*steps[:k], *alone, *steps[k + 1 :]])
    for k, s in enumerate(steps):
        for j, r in enumerate(s.requests):
            for smaller in _smaller(r, head):
                reqs = (*s.requests[:j], smaller, *s.requests[j + 1 :])
                yield _with(h, [*steps[:k], Step(requests=reqs), *steps[k + 1 :]])


def _smaller(r: Request, head: int) -> Iterator[Request]:
    """The request with its last turn dropped (a conversation), half or a quarter of its prompt's content cut from
    the end, or a shorter answer."""
    if r.turns:
        yield dataclasses.replace(r, turns=r.turns[:-1])
    body = len(r.prompt) - head
    for cut in (body // 2, body // 4):
        if cut >= 1 and body - cut >= 1:
            yield dataclasses.replace(r, prompt=r.prompt[: len(r.prompt) - cut])
    if r.new_tokens > 2:
        n = max(2, r.new_tokens // 2)
        yield dataclasses.replace(r, new_tokens=n, cancel_at=None if r.cancel_at is None else min(r.cancel_at, n - 1))


def _with(h: History, steps: list[Step]) -> History:
    return dataclasses.replace(h, steps=tuple(steps))


class Difference(Protocol):
    """A request's answer that differs (from its cold answer, or from the other server's): where it first does."""

    @property
    def name(self) -> str: ...

    @property
    def token_index(self) -> int | None: ...


@dataclasses.dataclass(frozen=True)
class Marks:
    """The difference a smaller history must still show: a request of the finding that differed confidently, at
    the token where it differed (in the finding's run or in any of its confirmations: a fresh server may part at
    another token than the long-lived one did), or anywhere where the smaller history changed that request's
    prompt or answer length (a cut prompt moves where its answer parts)."""

    at: frozenset[tuple[str, int | None]]
    requests: dict[str, Request]

    @classmethod
    def of(cls, history: History, runs: Iterable[Iterable[Difference]]) -> Marks:
        return cls(
            frozenset((j.name, j.token_index) for run in runs for j in run), {r.name: r for r in history.requests()}
        )

    def shown(self, candidate: History, confident: Iterable[Difference]) -> bool:
        asked = {r.name: r for r in candidate.requests()}
        names = {name for name, _ in self.at}
        for j in confident:
            was, now = self.requests.get(j.name), asked.get(j.name)
            if was is None or now is None or j.name not in names:
                continue
            if (j.name, j.token_index) in self.at or now.key() != was.key():
                return True
        return False

    def held(self, run: Callable[[History], Iterable[Difference]]) -> Callable[[History], bool]:
        """``still`` for the shrink: the difference in SHOWS fresh runs running (``run``: a history's confident
        differences, from a fresh run). One run showing any confident difference once let a request that differed
        at a token of small margin, on a loaded machine, shrink a finding to a history that never showed it again."""
        return lambda candidate: all(self.shown(candidate, run(candidate)) for _ in range(SHOWS))
