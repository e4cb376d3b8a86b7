"""The hunt: histories drawn strategy after strategy from one seed, each run on the server and every answer
judged against its cold answer, until the budget is spent; a confident difference is confirmed on fresh servers
(k of n), shrunk while it reproduces, and its minimal history confirmed again."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from meshbench.analysis import endpoint_margins as margins
from meshbench.analysis import hunt as judge
from meshbench.analysis.hunt import Checked, Judged
from meshbench.hunt import execute, oracle, shrink
from meshbench.hunt.execute import Host, Target
from meshbench.hunt.facts import from_props
from meshbench.records.history import Facts, History
from meshbench.records.margins import MarginPasses
from meshbench.workload.hunt import Strategy

CONFIRM = judge.CONFIRM
# Text whose ids prompts are drawn from (any text does: the content is those ids at random, repeated)
CORPUS = (
    "The river bends twice before it reaches the old mill, where a wooden wheel still turns in the spring floods. "
    "Seven lanterns hang along the bridge; the keeper lights them one by one as the evening market closes, and "
    "travellers count the copper coins, the barley sacks, the blue ribbons and the clay pots they carried home."
)


@dataclass
class Finding:
    found: Checked
    confirmations: list[Checked] = field(default_factory=list)  # its history run again CONFIRM times, fresh
    minimal: Checked | None = None  # the shrunk history, run once more
    minimal_confirmations: list[Checked] = field(default_factory=list)
    seconds_to_find: float = 0.0
    shrink_tries: int = 0  # candidate histories the shrink ran

    @property
    def confirmed(self) -> int:
        return judge.shown(self.confirmations)

    @property
    def minimal_confirmed(self) -> int:
        return judge.shown(self.minimal_confirmations)

    @property
    def reproduced(self) -> bool:
        """Shown again in a run of its history or of its minimal one: a finding (else a difference seen once)."""
        return bool(self.confirmed or self.minimal_confirmed)


@dataclass
class Hunt:
    seed: int
    strategies: list[str]
    facts: Facts
    calibration: MarginPasses
    threshold: float
    how_cold: str  # where cold answers come from
    replays_on: str  # where a finding's history is run again
    checked: list[Checked] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    seconds: float = 0.0


def calibrated(server: Host, seed: int) -> tuple[Facts, MarginPasses, float, oracle.Oracle]:
    """The server's facts, its numerics measured (the passes, the near-tie threshold), and an oracle on it."""
    assert server.target is not None
    facts = facts_of(server.target)
    passes = oracle.calibrate(server.target, facts, seed)
    return facts, passes, oracle.threshold(passes), oracle.Oracle(server.target)


def replays(server: Host, h: History, n: int = CONFIRM) -> tuple[list[Checked], float]:
    """``h`` run ``n`` times, each on a fresh server where meshbench started it; the near-tie threshold."""
    _, _, limit, cold = calibrated(server, h.seed[0] if h.seed else 0)
    return [replay(server, cold, h, limit) for _ in range(n)], limit


def facts_of(target: Target) -> Facts:
    """The server's facts: /props, and the corpus tokenized by the server (its head: what it adds to any text)."""
    head = target.tokenize([""])[0]
    ids = target.tokenize([CORPUS])[0][len(head) :]
    return from_props(target.props, head, sorted(set(ids)))


def check(target: Target, cold: oracle.Oracle, h: History, limit: float) -> Checked:
    answers = execute.run(target, h)
    colds = {r.name: cold.cold(r) for r in h.requests() if r.cancel_at is None}
    return judge.checked(h, answers, colds, limit)


def hunt(
    server: Host,
    strategies: list[Strategy],
    seed: int,
    until: Callable[[int, float], bool],
    progress: Callable[[str], None] = lambda m: None,
    settle_s: float | None = None,
    shrink_tries: list[int] | None = None,
) -> Hunt:
    """Histories until ``until(requests sent, seconds)`` says the budget is spent, or a confident difference is
    confirmed and shrunk and shows again. A difference that shows in no run again, nor its shrunk history, is kept
    and the hunt goes on: a flip seen once, most likely numerics a little above the measured near-tie.
    ``settle_s``: from a finding, its confirmations and shrink take at most about that long (the shrink tries no
    candidate after it; None: its tries alone bound it). A 10-minute hunt's first finding, seen again in none of three
    runs, once took its shrink past 15 minutes on llama-server, a fresh server per try."""
    t0 = time.monotonic()
    facts, passes, limit, cold = calibrated(server, seed)
    progress(f"numerics measured: a near-tie is a margin of at most {limit:.3g}")
    h = Hunt(seed, [s.name for s in strategies], facts, passes, limit, cold.target.how_cold, server.replays_on())
    sent, k = 0, 0
    while not until(sent, time.monotonic() - t0):
        s = strategies[k % len(strategies)]
        history = s.draw(np.random.default_rng([seed, k]), facts, [seed, k])
        got = check(cold.target, cold, history, limit)
        h.checked.append(got)
        sent, k = sent + len(history.requests()), k + 1
        progress(f"history {k} ({s.name}): {_counts(got.judged)}")
        if judge.confident(got.judged):
            at = time.monotonic() - t0
            deadline = None if settle_s is None else time.monotonic() + settle_s
            tries = shrink.MAX_TRIES
            if shrink_tries is not None:
                deadline, tries = None, shrink_tries[len(h.findings)] if len(h.findings) < len(shrink_tries) else 0
            found = _settle(server, cold, got, limit, at, progress, deadline, tries)
            h.findings.append(found)
            if found.reproduced:
                break
            progress("not reproduced in any run again, nor its shrunk history: a difference seen once; hunting on")
    h.seconds = time.monotonic() - t0
    return h


def _settle(
    server: Host,
    cold: oracle.Oracle,
    got: Checked,
    limit: float,
    at: float,
    progress: Callable[[str], None],
    deadline: float | None = None,
    tries: int = shrink.MAX_TRIES,
) -> Finding:
    """Confirm a finding on fresh servers, shrink it, confirm the minimal history."""
    found = Finding(got, seconds_to_find=at)
    found.confirmations = [replay(server, cold, got.history, limit) for _ in range(CONFIRM)]
    progress(f"finding confirmed {found.confirmed} of {CONFIRM} runs on {server.replays_on()}; shrinking it")

    marks = shrink.Marks.of(got.history, [judge.confident(c.judged) for c in (got, *found.confirmations)])
    still = marks.held(lambda c: judge.confident(replay(server, cold, c, limit).judged))
    used: list[int] = []
    head = len(facts_head(server))
    minimal = shrink.shrink(got.history, still, head, tries, progress=progress, deadline=deadline, used=used)
    found.shrink_tries = used[0]
    found.minimal = replay(server, cold, minimal, limit)
    found.minimal_confirmations = [replay(server, cold, minimal, limit) for _ in range(CONFIRM)]
    steps, reqs, ids = minimal.size()
    progress(f"minimal history: {steps} steps, {reqs} requests, {ids} prompt ids; {found.minimal_confirmed} of "
             f"{CONFIRM} runs show it")  # fmt: skip
    return found


def facts_head(server: Host) -> list[int]:
    assert server.target is not None
    return server.target.tokenize([""])[0]


def replay(server: Host, cold: oracle.Oracle, h: History, limit: float) -> Checked:
    """``h`` on a fresh server (where meshbench started it), its cold answers from the memo or that server."""
    target = server.fresh()
    return check(target, cold.with_target(target), h, limit)


def _counts(judged: list[Judged]) -> str:
    outcomes = [j.outcome for j in judged]
    return ", ".join(f"{outcomes.count(o)} {o}" for o in dict.fromkeys(outcomes))


def numerics_said(passes: MarginPasses) -> str:
    """What the threshold rests on, in words (empty: nothing to add)."""
    return "; ".join(x for x in (margins.inconsistent(passes), margins.caveats(passes)) if x)
