"""Differential hunting: the same histories against two servers, two builds or two settings of one build. The
cold oracle cannot see a bug inside a mechanism that approximates by design (KV reused at shifted positions, a
context shift, a sliding window's cache), where an answer may differ from cold on any build; two builds on
identical histories can. Where their answers to one request part, each server's cold answer says whether the
parting comes from the history: cold answers that agree and answers that part at a token where both servers'
margins are above the near-tie are a confident parting (whichever build is wrong); cold answers that already
part are the builds' own numerics or defaults, reported apart and never a finding. The first confident parting
ends the hunt: it is run again on fresh servers, shrunk while the two still part confidently, and its minimal
history run again (``meshbench hunt --against... --out DIR`` writes it as DIR/finding-1.json)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from meshbench.analysis import endpoint_margins as margins
from meshbench.analysis import hunt as judge
from meshbench.analysis.hunt import Checked
from meshbench.errors import MeshbenchError
from meshbench.hunt import oracle, shrink
from meshbench.hunt.execute import Host
from meshbench.hunt.run import CONFIRM, calibrated, check, replay
from meshbench.records.history import History
from meshbench.workload.hunt import Strategy


class NothingCompared(MeshbenchError):
    """A differential replay that compared nothing: not a pass."""


@dataclass(frozen=True, slots=True)
class Parting:
    name: str
    token_index: int
    margin_a: float | None  # each server's margin where they part
    margin_b: float | None
    colds_agree: bool  # the two servers' cold answers are the same tokens
    confident: bool  # colds agree and both margins are above the near-tie


@dataclass
class Pair:
    limit: float  # the larger of the two servers' near-tie thresholds
    checked: list[tuple[Checked, Checked]] = field(default_factory=list)
    partings: list[list[Parting]] = field(default_factory=list)
    seconds: float = 0.0
    confirmed: int = 0  # of CONFIRM runs of the parting history on fresh servers, those that part confidently
    minimal: History | None = None  # the history shrunk while the servers still part confidently on it
    minimal_confirmed: int = 0  # of CONFIRM runs of the minimal history, those that part confidently


def compared(a: Checked, b: Checked) -> list[str]:
    """The requests both servers answered whole, with both cold answers (none cancelled): those ``parted`` reads."""
    out = []
    for r in a.history.requests():
        four = (a.answers.get(r.name), b.answers.get(r.name), a.cold.get(r.name), b.cold.get(r.name))
        if r.cancel_at is None and all(x is not None and x.error is None for x in four):
            out.append(r.name)
    return out


def parted(a: Checked, b: Checked, limit: float) -> list[Parting]:
    """Every request both servers answered whole (none cancelled), where their answers first differ."""
    out = []
    for name in compared(a, b):
        x, y, ca, cb = a.answers[name], b.answers[name], a.cold[name], b.cold[name]
        r = next(q for q in a.history.requests() if q.name == name)
        k = margins.first_difference(x.tokens, y.tokens)
        if k is None or k >= min(len(x.tokens), len(y.tokens)):
            continue
        ma = x.margins[k] if x.margins is not None and k < len(x.margins) else None
        mb = y.margins[k] if y.margins is not None and k < len(y.margins) else None
        agree = ca.tokens == cb.tokens
        sure = agree and ma is not None and mb is not None and ma > limit and mb > limit
        out.append(Parting(r.name, k, ma, mb, agree, sure))
    return out


def hunt_pair(
    a: Host,
    b: Host,
    strategies: list[Strategy],
    seed: int,
    until: Callable[[int, float], bool],
    progress: Callable[[str], None] = lambda m: None,
) -> Pair:
    """Histories drawn as ``meshbench.hunt.run.hunt`` draws them, each run on ``a`` then on ``b``, each answer held
    to its own server's cold answer and the two servers' answers to each other."""
    t0 = time.monotonic()
    facts, _, limit_a, cold_a = calibrated(a, seed)
    other, _, limit_b, cold_b = calibrated(b, seed)
    if (other.head, other.pool) != (facts.head, facts.pool):
        raise MeshbenchError("the two servers tokenize a text differently: a differential hunt needs one model on both")
    pair = Pair(max(limit_a, limit_b))
    sent, k = 0, 0
    while not until(sent, time.monotonic() - t0):
        s = strategies[k % len(strategies)]
        h: History = s.draw(np.random.default_rng([seed, k]), facts, [seed, k])
        got = (check(cold_a.target, cold_a, h, limit_a), check(cold_b.target, cold_b, h, limit_b))
        pair.checked.append(got)
        pair.partings.append(parted(*got, pair.limit))
        sent, k = sent + 2 * len(h.requests()), k + 1
        sure = sum(p.confident for p in pair.partings[-1])
        own = [len(judge.confident(c.judged)) for c in got]
        progress(f"history {k} ({s.name}): {len(pair.partings[-1])} part, {sure} confidently; confident against "
                 f"their own cold answers: {own[0]} and {own[1]}")  # fmt: skip
        if sure:
            _settle(pair, Side(a, cold_a, limit_a), Side(b, cold_b, limit_b), h, len(facts.head), progress)
            break
    pair.seconds = time.monotonic() - t0
    return pair


@dataclass(frozen=True, slots=True)
class Side:
    host: Host
    cold: oracle.Oracle
    limit: float


def replayed(a: Side, b: Side, h: History, limit: float, whole: list[int] | None = None) -> list[Parting]:
    """``h`` on a fresh ``a`` and a fresh ``b`` (where meshbench started them): where their answers part (and, in
    ``whole``, how many requests both answered whole)."""
    x, y = replay(a.host, a.cold, h, a.limit), replay(b.host, b.cold, h, b.limit)
    if whole is not None:
        whole.append(len(compared(x, y)))
    return parted(x, y, limit)


def shown(runs: list[list[Parting]]) -> int:
    return sum(any(p.confident for p in ps) for ps in runs)


def _settle(pair: Pair, a: Side, b: Side, h: History, head: int, progress: Callable[[str], None]) -> None:
    """A confident parting confirmed on fresh servers, shrunk while the pair still parts confidently, and its
    minimal history confirmed again."""
    confirmations = [replayed(a, b, h, pair.limit) for _ in range(CONFIRM)]
    pair.confirmed = shown(confirmations)
    progress(f"parting confirmed in {pair.confirmed} of {CONFIRM} runs; shrinking it")
    found = pair.partings[-1]  # (the history being settled is the last one checked)
    marks = shrink.Marks.of(h, [[p for p in ps if p.confident] for ps in [found, *confirmations]])

    still = marks.held(lambda c: [p for p in replayed(a, b, c, pair.limit) if p.confident])
    pair.minimal = shrink.shrink(h, still, head, progress=progress)
    pair.minimal_confirmed = shown([replayed(a, b, pair.minimal, pair.limit) for _ in range(CONFIRM)])
    steps, reqs, ids = pair.minimal.size()
    progress(f"minimal history: {steps} steps, {reqs} requests, {ids} prompt ids; {pair.minimal_confirmed} of "
             f"{CONFIRM} runs part confidently")  # fmt: skip


def lines(pair: Pair) -> list[str]:
    """The pair in words: confident partings first, then the partings the builds' own cold answers explain."""
    every = [(c[0].history, p) for c, ps in zip(pair.checked, pair.partings) for p in ps]
    sure = [(h, p) for h, p in every if p.confident]
    out = [
        f"{len(pair.checked)} histories on both servers in {pair.seconds:.0f} s: {len(every)} answers part, "
        f"{len(sure)} confidently (cold answers agreeing, both margins above {pair.limit:.3g})"
    ]
    for h, p in sure:
        r = next(x for x in h.requests() if x.name == p.name)
        out.append(f"  {h.strategy} {h.seed}: {p.name} ({r.carries}) parts at token {p.token_index}, margins "
                   f"{p.margin_a:.3g} and {p.margin_b:.3g}")  # fmt: skip
    apart = sum(not p.colds_agree for _, p in every)
    if apart:
        out.append(f"  {apart} partings where the two servers' cold answers already differ: their own numerics")
    if pair.minimal is not None:
        steps, reqs, ids = pair.minimal.size()
        out.append(f"the confident parting shown again in {pair.confirmed} of {CONFIRM} runs on fresh servers; "
                   f"minimal history {steps} steps, {reqs} requests, {ids} prompt ids, shown in "
                   f"{pair.minimal_confirmed} of {CONFIRM}")  # fmt: skip
    return out


def replays(a: Host, b: Host, h: History, seed: int, progress: Callable[[str], None] = lambda m: None) -> int:
    """``h`` on fresh ``a`` and ``b``, CONFIRM times: the runs in which they part confidently (a MeshbenchError
    where no request came back whole from both: nothing was compared)."""
    _, _, limit_a, cold_a = calibrated(a, seed)
    _, _, limit_b, cold_b = calibrated(b, seed)
    limit, whole = max(limit_a, limit_b), list[int]()
    runs = [replayed(Side(a, cold_a, limit_a), Side(b, cold_b, limit_b), h, limit, whole) for _ in range(CONFIRM)]
    if not any(whole):
        raise NothingCompared(f"no request of the history came back whole from both servers in {CONFIRM} runs")
    for k, ps in enumerate(runs, 1):
        for p in ps:
            if p.confident:
                progress(f"run {k}: {p.name} parts at token {p.token_index}, margins {p.margin_a:.3g} and "
                         f"{p.margin_b:.3g}")  # fmt: skip
    return shown(runs)
