"""The hunt's strategies, by name: each draws a request history that reaches one mechanism where cross-request
bugs have lived (a prefix cache's boundaries, reuse of chunks that are not a prefix, eviction, identical prompts
at once, a client that disconnects, a crowd of requests sharing documents, conversations carrying their answers).
They know the mechanisms, never a particular bug: no strategy is written to one bug's trigger.

Every prompt is content a model answers confidently (``content``), each request's drawn anew
unless the strategy shares it, so the requests of a history share exactly what the strategy put in them."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Callable

import numpy as np

from meshbench.errors import MeshbenchError
from meshbench.records.history import Facts, History, Request, Step

PERIOD = (5, 12)  # a repeated run is this many ids long (drawn)
NEW_TOKENS = (4, 12)  # each answer's length, drawn
MAX_PROMPT = 2100  # a prompt's ids at most (the batch boundary 2048 and its neighbours fit)


def content(rng: np.random.Generator, facts: Facts, n: int) -> list[int]:
    """``n`` ids of content: a run of PERIOD ids drawn from the pool, repeated (and cut) to the length."""
    if n <= 0:
        return []
    period = int(rng.integers(PERIOD[0], PERIOD[1] + 1))
    run = [int(facts.pool[k]) for k in rng.integers(0, len(facts.pool), size=period)]
    return [run[k % period] for k in range(n)]


DEFAULT_BUDGET = "10m"  # meshbench hunt --budget
BUDGET = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(s|m|h)?\s*")
UNITS = {"s": 1, "m": 60, "h": 3600}


def budget(value: str) -> tuple[float | None, int | None]:
    """``--budget``: a time (90s, 10m, 1h) or a number of requests (500); (seconds, requests)."""
    m = BUDGET.fullmatch(value)
    if not m or float(m.group(1)) <= 0:
        raise MeshbenchError(f"--budget {value[:40]!r}: a time such as 90s, 10m or 1h, or a number of requests")
    n, unit = float(m.group(1)), m.group(2)
    if unit is None:
        if not n.is_integer():
            raise MeshbenchError(f"--budget {value[:40]!r}: a number of requests is a whole number")
        return None, int(n)
    return n * UNITS[unit], None


def prompt(rng: np.random.Generator, facts: Facts, n: int) -> list[int]:
    """A whole prompt of ``n`` ids (the head included): the head, then content."""
    return [*facts.head, *content(rng, facts, n - len(facts.head))]


CALIBRATION, CALIBRATION_TOKENS = 8, 12  # requests measured cold, cold all at once and warm; each one's answer


def calibration(facts: Facts, seed: int) -> list[Request]:
    """The requests c0, c1, ... the near-tie threshold is measured from, drawn from the hunt's seed."""
    rng = np.random.default_rng([seed, 0, 1])
    return [
        Request(
            name=f"c{k}", prompt=tuple(prompt(rng, facts, int(rng.integers(16, 200)))), new_tokens=CALIBRATION_TOKENS
        )
        for k in range(CALIBRATION)
    ]


@dataclass(frozen=True, slots=True)
class Strategy:
    name: str
    mechanism: str  # in words, for the README and --help
    draw: Callable[[np.random.Generator, Facts, list[int]], History]


STRATEGIES: dict[str, Strategy] = {}


Draw = Callable[[np.random.Generator, Facts, "_Names"], list[list[Request]]]


def _strategy(name: str, mechanism: str) -> Callable[[Draw], Draw]:
    def register(draw: Draw) -> Draw:
        def make(rng: np.random.Generator, facts: Facts, seed: list[int]) -> History:
            steps = draw(rng, facts, _Names(rng))
            return History(strategy=name, seed=seed, steps=tuple(Step(requests=tuple(s)) for s in steps))

        STRATEGIES[name] = Strategy(name, mechanism, make)
        return draw

    return register


class _Names:
    """Each request's name (r0, r1, ...) and its answer's length, drawn."""

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng, self.k = rng, 0

    def __call__(self, ids: list[int], carries: str, cancel_at: int | None = None) -> Request:
        name, self.k = f"r{self.k}", self.k + 1
        n = int(self.rng.integers(NEW_TOKENS[0], NEW_TOKENS[1] + 1))
        cut = None if cancel_at is None else min(cancel_at, n - 1)
        return Request(name=name, prompt=tuple(ids), new_tokens=n, cancel_at=cut, carries=carries)


def room(facts: Facts) -> int:
    """The longest prompt a strategy draws: within one slot's context with an answer, and MAX_PROMPT."""
    return max(len(facts.head) + 8, min(MAX_PROMPT, facts.n_ctx - NEW_TOKENS[1] - 8))


def _len(rng: np.random.Generator, lo: int, hi: int) -> int:
    return int(rng.integers(lo, max(lo, hi) + 1))


@_strategy(
    "prefix-boundary", "a shared prefix ending at, one before or one after a block, micro-batch or batch boundary"
)
def _prefix_boundary(rng: np.random.Generator, facts: Facts, req: _Names) -> list[list[Request]]:
    b = int(rng.choice(facts.boundaries(room(facts) - 16)))
    first = [*prompt(rng, facts, b), *content(rng, facts, _len(rng, 4, 16))]
    steps = [[req(first, f"{b} ids, then its own")]]
    for d in rng.permutation([-1, 0, 1])[: _len(rng, 1, 3)]:
        share = max(len(facts.head) + 1, b + int(d))
        steps.append([req([*first[:share], *content(rng, facts, _len(rng, 4, 16))], f"{share} ids of r0")])
    return steps


@_strategy("chunk-reuse", "an earlier prompt's chunks kept with others between them dropped or reordered")
def _chunk_reuse(rng: np.random.Generator, facts: Facts, req: _Names) -> list[list[Request]]:
    n = _len(rng, 3, 5)
    size = max(8, min(64, (room(facts) - len(facts.head)) // n))
    chunks = [content(rng, facts, _len(rng, 8, size)) for _ in range(n)]
    order = list(range(n))
    steps = [[req([*facts.head, *(t for c in chunks for t in c)], f"chunks {order}")]]
    for _ in range(_len(rng, 1, 3)):
        kept = sorted(rng.choice(n, size=_len(rng, 2, n - 1), replace=False).tolist())
        if rng.random() < 0.5:
            kept = [int(k) for k in rng.permutation(kept)]
        steps.append([req([*facts.head, *(t for k in kept for t in chunks[k])], f"chunks {kept} of r0")])
    return steps


@_strategy("eviction", "more distinct prefixes than slots, then the first ones again")
def _eviction(rng: np.random.Generator, facts: Facts, req: _Names) -> list[list[Request]]:
    n = min(12, facts.slots + _len(rng, 1, 3))
    prefixes = [prompt(rng, facts, _len(rng, 24, min(256, room(facts) - 16))) for _ in range(n)]
    at_once = _len(rng, 1, max(1, min(facts.slots, 4)))
    first = [req([*p, *content(rng, facts, 4)], f"prefix {k}") for k, p in enumerate(prefixes)]
    steps = [first[k : k + at_once] for k in range(0, n, at_once)]
    for k in rng.permutation(n)[: _len(rng, 1, n)]:
        steps.append([req([*prefixes[int(k)], *content(rng, facts, _len(rng, 4, 16))], f"prefix {int(k)} again")])
    return steps


@_strategy("same-at-once", "identical and near-identical prompts at once, after one of them alone")
def _same_at_once(rng: np.random.Generator, facts: Facts, req: _Names) -> list[list[Request]]:
    base = prompt(rng, facts, _len(rng, 12, min(300, room(facts))))
    crowd = []
    for _ in range(_len(rng, 2, max(2, min(8, 2 * facts.slots)))):
        if rng.random() < 0.5:
            crowd.append(req(base, "the same prompt"))
        else:
            near = list(base)
            at = _len(rng, len(facts.head), len(near) - 1)
            near[at] = int(facts.pool[int(rng.integers(0, len(facts.pool)))])
            crowd.append(req(near, f"the same prompt, id {at} changed"))
    return [[req(base, "the prompt alone")], crowd] if rng.random() < 0.5 else [crowd]


@_strategy("cancel-retry", "a client that disconnects mid-answer beside one sharing its prefix, then the retry")
def _cancel_retry(rng: np.random.Generator, facts: Facts, req: _Names) -> list[list[Request]]:
    shared = prompt(rng, facts, _len(rng, 16, min(400, room(facts) - 16)))
    first = [*shared, *content(rng, facts, _len(rng, 4, 16))]
    beside = req([*shared, *content(rng, facts, _len(rng, 4, 16))], "r0's prefix")
    cut = req(first, "cancelled", cancel_at=_len(rng, 1, NEW_TOKENS[1]))
    retry = [req(first, "r0 again (the retry)"), req([*shared, *content(rng, facts, 6)], "r0's prefix")]
    return [[cut, beside], retry]


@_strategy("crowd", "requests at once sharing prefixes of a few documents, step after step")
def _crowd(rng: np.random.Generator, facts: Facts, req: _Names) -> list[list[Request]]:
    docs = [prompt(rng, facts, _len(rng, 24, min(400, room(facts) - 16))) for _ in range(_len(rng, 2, 4))]
    steps = []
    for _ in range(_len(rng, 2, 5)):
        step = []
        for _ in range(_len(rng, 1, max(1, min(6, facts.slots + 1)))):
            d = int(rng.integers(0, len(docs)))
            keep = _len(rng, len(facts.head) + 1, len(docs[d]))
            step.append(req([*docs[d][:keep], *content(rng, facts, _len(rng, 2, 12))], f"{keep} ids of doc {d}"))
        steps.append(step)
    return steps


@_strategy("conversation", "conversations grown turn by turn, then forked, truncated or resumed after other traffic")
def _conversation(rng: np.random.Generator, facts: Facts, req: _Names) -> list[list[Request]]:
    talks = [prompt(rng, facts, _len(rng, 8, 64)) for _ in range(_len(rng, 1, 2))]
    turns: list[list[list[int]]] = [[] for _ in talks]
    steps = []
    for _ in range(_len(rng, 3, 6)):  # each turn: the last one's prompt, an answer and a message after it
        k = int(rng.integers(0, len(talks)))
        grown = [*talks[k], *content(rng, facts, _len(rng, 24, 160))]
        if len(grown) >= room(facts):
            break
        talks[k] = grown
        turns[k].append(grown)
        steps.append([req(grown, f"conversation {k}, turn {len(turns[k])}")])
    k = max(range(len(talks)), key=lambda j: len(turns[j]))
    done = turns[k] or [talks[k]]
    j = int(rng.integers(0, len(done)))
    cut = _len(rng, len(facts.head) + 1, len(done[j]) - 1)
    edits = [
        (done[j], _len(rng, 8, 64), f"conversation {k} forked after turn {j + 1}"),
        (done[j][:cut], _len(rng, 4, 32), f"conversation {k} edited at id {cut}"),
        (done[j], 0, f"conversation {k}, turn {j + 1} again"),
        (done[-1], _len(rng, 8, 64), f"conversation {k} resumed after other traffic"),
    ]
    for e in rng.permutation(len(edits))[: _len(rng, 1, len(edits))]:
        base, more, what = edits[int(e)]
        more = min(more, room(facts) - len(base))
        if more < 0 or (more == 0 and "again" not in what):
            continue
        if rng.random() < 0.5:  # other traffic first
            steps.append([req(prompt(rng, facts, _len(rng, 16, min(200, room(facts)))), "unrelated")])
        steps.append([req([*base, *content(rng, facts, more)], what)])
    return steps


@_strategy(
    "turns", "conversations whose later turns carry the server's own answers, several at once or one after another"
)
def _turns(rng: np.random.Generator, facts: Facts, req: _Names) -> list[list[Request]]:
    talks = []
    for k in range(_len(rng, 2, 4)):
        first = prompt(rng, facts, _len(rng, 12, min(160, room(facts) // 2)))
        messages = [tuple(content(rng, facts, _len(rng, 4, 32))) for _ in range(_len(rng, 1, 3))]
        r = req(first, f"conversation {k}")
        while messages and len(first) + sum(map(len, messages)) + r.new_tokens * (1 + len(messages)) > room(facts):
            messages.pop()
        talks.append(dataclasses.replace(r, turns=tuple(messages)))
    at_once = _len(rng, 1, max(1, min(len(talks), facts.slots)))
    steps = [talks[k : k + at_once] for k in range(0, len(talks), at_once)]
    if rng.random() < 0.5:  # then one of them again, whole, after the others ended
        again = talks[int(rng.integers(0, len(talks)))]
        r = req(list(again.prompt), f"{again.name} again, every turn")
        steps.append([dataclasses.replace(r, new_tokens=again.new_tokens, turns=again.turns)])
    return steps


def chosen(names: str) -> list[Strategy]:
    """``--strategies``: names separated by commas, or ``all``; an unknown name is the input's error."""
    wanted = list(STRATEGIES) if names.strip() == "all" else [n.strip() for n in names.split(",") if n.strip()]
    unknown = [n for n in wanted if n not in STRATEGIES]
    if unknown or not wanted:
        raise MeshbenchError(
            f"--strategies {names[:80]!r}: {'unknown ' + unknown[0][:40] if unknown else 'none named'} "
            f"(choose from {', '.join(STRATEGIES)}, or all)"
        )
    return [STRATEGIES[n] for n in dict.fromkeys(wanted)]
