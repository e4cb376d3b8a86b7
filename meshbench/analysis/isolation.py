"""Isolation proven by perturbation: no session's output depends on another session's content.

A level is run again with the prompts of some sessions replaced by other tokens of the same lengths.
The lengths stay, so the schedule must stay: every tick record (the decode feed reduced to sessions
and positions) must equal the level's. Every session that was not perturbed must then give the same
tokens AND the same margins, bit for bit: margins catch a contamination that does not flip a token.

Which sessions each pass perturbs is a separating family: session i gets a distinct subset S_i of
size floor(m/2) of the m passes (C(m, floor(m/2)) >= N), and pass p perturbs every i with p in S_i.
For every ordered pair (i, j), S_j is not inside S_i, so some pass perturbs j and not i: 6 passes
for 16 sessions, 8 for 64. The family is run ``rounds`` times.

Every perturbed session gets fresh random content in every pass (seeded by the workload seed, the
pass and the session), so a dependence on any feature of a neighbour's content is caught with a
stated probability rather than missed for good: a dependence of session i on one bit of session j's
content (a parity, a token's low bit) flips with probability 1/2 in each pass that perturbs j and
not i, and escapes all n such passes with probability 2^-n. ``escape_bits`` is the smallest n over
the ordered pairs: the bound a level states. A session that changed is then tested against each
suspect alone (up to CONFIRM_TRIES fresh passes per suspect), so a leak is reported with both
sessions named.

End of sequence: a perturbed session is pinned to its length in the level (``end_at``), stop
tokens or not, so its neighbours see the same schedule; an unperturbed one keeps the workload's
eos policy and must end where it ended. The proof is about content: it cannot see a dependence on
a neighbour's length or timing, which the schedule fixes.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import math
from typing import Sequence

import numpy as np

from meshbench.records import serial
from meshbench.records.model import (
    IsolationPass,
    IsolationRecords,
    IsolationVerdict,
    JsonObject,
    LevelRecord,
    PassSession,
    SessionRecord,
    Tick,
)
from meshbench.scheduler.session import GenerationRequest

METHOD = (
    "perturbation: the level rerun with the prompt content of chosen sessions replaced by fresh random "
    "tokens in every pass (same lengths, so the same schedule, checked tick by tick); every other session's "
    "tokens and margins compared bit for bit; perturbed sets form a separating family (every ordered pair "
    "(i, j) has a pass perturbing j and not i), run in rounds; a dependence on one bit of a neighbour's "
    "content escapes n passes with probability 2^-n; a changed session is confirmed against each suspect alone"
)
MAX_CONFIRMATIONS = 16  # suspects confirmed per level at most
CONFIRM_TRIES = 4  # fresh single-suspect passes per suspect, until one of its victims changes


def pass_count(sessions: int) -> int:
    """The fewest passes m whose subsets of size floor(m/2) number at least ``sessions`` (0 for one session)."""
    if sessions <= 1:
        return 0
    m = 1
    while math.comb(m, m // 2) < sessions:
        m += 1
    return m


def perturbed_sets(ids: Sequence[str]) -> list[list[str]]:
    """The sessions each pass perturbs: session k takes the k-th subset (lexicographic) of size floor(m/2)."""
    m = pass_count(len(ids))
    subsets = list(itertools.islice(itertools.combinations(range(m), m // 2), len(ids)))
    return [[sid for sid, sub in zip(ids, subsets) if p in sub] for p in range(m)]


def family_sets(ids: Sequence[str], rounds: int) -> list[list[str]]:
    """The family's passes: the separating family, ``rounds`` times over (fresh content in each pass)."""
    return perturbed_sets(ids) * rounds


def escape_bits(ids: Sequence[str], sets: Sequence[Sequence[str]]) -> int | None:
    """The fewest passes that perturb j and not i, over ordered pairs (i, j): a one-bit dependence escapes
    every pass with probability 2^-escape_bits (None for a single session: no pair)."""
    counts = [sum(1 for s in sets if j in s and i not in s) for i in ids for j in ids if i != j]
    return min(counts) if counts else None


def separates(ids: Sequence[str], sets: Sequence[Sequence[str]]) -> bool:
    """Every ordered pair (i, j), i != j, has a set holding j and not i."""
    return all(any(j in s and i not in s for s in sets) for i in ids for j in ids if i != j)


def perturb(prompt: Sequence[int], vocab_size: int, seed: int, index: int, pass_no: int) -> tuple[int, ...]:
    """Other tokens of the same length: every position moved by a nonzero offset, drawn afresh for every
    session in every pass."""
    rng = np.random.default_rng([seed, pass_no, index, 0x150])
    offsets = rng.integers(1, vocab_size, len(prompt))  # (prompt,): never 0, so every token changes
    return tuple(int((t + o) % vocab_size) for t, o in zip(prompt, offsets))


def requests_for(
    requests: Sequence[GenerationRequest],
    perturbed: Sequence[str],
    baseline: dict[str, SessionRecord],
    vocab_size: int,
    seed: int,
    pass_no: int,
) -> list[GenerationRequest]:
    """The pass's requests: perturbed sessions with other prompt content, pinned to their baseline length."""
    out = []
    for k, r in enumerate(requests):
        if r.session_id in perturbed:
            r = dataclasses.replace(r, prompt_tokens=perturb(r.prompt_tokens, vocab_size, seed, k, pass_no))
            if r.session_id in baseline:  # (one the level refused is refused again: same lengths, same queue)
                r = dataclasses.replace(r, end_at=max(len(baseline[r.session_id].tokens), 1))
        out.append(r)
    return out


def schedule_view(ticks: Sequence[Tick]) -> list[JsonObject]:
    """Deterministic tick records as results.json holds them, the decode feed reduced to (session, position):
    the schedule."""
    return [{**serial.to_json(t), "decode_feed": [f[:2] for f in t.decode_feed]} for t in ticks]


def digest(value: object) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, allow_nan=False).encode()).hexdigest()


def pass_record(
    perturbed: Sequence[str], ticks: Sequence[Tick], sessions: Sequence[SessionRecord], confirm: bool
) -> IsolationPass:
    """One perturbation pass as results.json holds it: whom it perturbed, its schedule's digest, and each
    session's token and margin digests."""
    return IsolationPass(
        perturbed=list(perturbed),
        confirm=confirm,
        schedule_digest=digest(schedule_view(ticks)),
        sessions=[
            PassSession(session_id=s.session_id, digest=s.digest, margins_digest=digest(s.margins)) for s in sessions
        ],
    )


def changed(sessions: Sequence[SessionRecord], p: IsolationPass) -> list[str]:
    """Sessions the pass did not perturb whose tokens or margins differ from the level's ``sessions``."""
    base = {s.session_id: (s.digest, digest(s.margins)) for s in sessions}
    return sorted(
        s.session_id
        for s in p.sessions
        if s.session_id not in p.perturbed and base.get(s.session_id) != (s.digest, s.margins_digest)
    )


def suspects(
    victim: str, family: Sequence[IsolationPass], changed_in: Sequence[list[str]], ids: Sequence[str]
) -> list[str]:
    """Who ``victim`` may depend on: the sessions perturbed in every family pass where it changed, or, where no
    one was (it depends on several), every session perturbed in any of them. Random content need not flip a
    dependence, so a pass where the victim held acquits no one."""
    hits = [set(p.perturbed) for p, c in zip(family, changed_in) if victim not in p.perturbed and victim in c]
    if not hits:
        return []
    common = set.intersection(*hits)
    return [j for j in ids if j != victim and j in (common or set.union(*hits))]


def culprits(
    sessions: Sequence[SessionRecord], family: Sequence[IsolationPass], ids: Sequence[str]
) -> dict[str, set[str]]:
    """The suspects to confirm, in session order (at most MAX_CONFIRMATIONS), each with the victims it is
    suspected of."""
    changed_in = [changed(sessions, p) for p in family]
    blamed = {v: suspects(v, family, changed_in, ids) for c in changed_in for v in c}
    order = list(dict.fromkeys(j for j in ids for v in sorted(blamed) if j in blamed[v]))[:MAX_CONFIRMATIONS]
    return {j: {v for v in blamed if j in blamed[v]} for j in order}


def expected_confirmations(level: LevelRecord) -> list[list[str]]:
    """The confirmation passes the method prescribes, given the recorded passes' outcomes: for each culprit in
    order, single-suspect passes until one changes a victim of it, CONFIRM_TRIES at most."""
    passes = level.isolation.passes or []
    family = [p for p in passes if not p.confirm]
    recorded = iter(p for p in passes if p.confirm)
    out: list[list[str]] = []
    for j, victims in culprits(level.sessions, family, level.isolation.sessions or []).items():
        for _ in range(CONFIRM_TRIES):
            out.append([j])
            p = next(recorded, None)
            if p is None or victims & set(changed(level.sessions, p)):
                break
    return out


def verdict(records: IsolationRecords, sessions: Sequence[SessionRecord], ticks: Sequence[Tick]) -> IsolationVerdict:
    """A level's isolation verdict, recomputed from its records (what the sweep writes and verify checks): its
    perturbation passes ``records``, judged against the level's own ``sessions`` and deterministic ``ticks``."""
    if records.passes is None:
        return IsolationVerdict(
            ran=False,
            holds=None,
            schedule_changed=[],
            changed=[],
            leaks=[],
            separating=None,
            family_passes=0,
            escape_bits=None,
            confirmations=0,
            suspects={},
            reason=records.reason,
        )
    base = digest(schedule_view(ticks))
    passes = records.passes
    schedule = [k for k, p in enumerate(passes) if p.schedule_digest != base]
    changed_in = [changed(sessions, p) for p in passes]
    leaks = sorted({(victim, p.perturbed[0]) for p, c in zip(passes, changed_in) if p.confirm for victim in c})
    victims = sorted({v for c in changed_in for v in c})
    ids = records.sessions or []  # every arrival, served or refused
    family = [p for p in passes if not p.confirm]
    family_changed = [changed(sessions, p) for p in family]
    return IsolationVerdict(
        ran=True,
        holds=not schedule and not victims,
        schedule_changed=schedule,
        changed=victims,
        leaks=[list(x) for x in leaks],
        separating=separates(ids, [p.perturbed for p in family]),
        family_passes=len(family),
        escape_bits=escape_bits(ids, [p.perturbed for p in family]),
        confirmations=len(passes) - len(family),
        suspects={v: suspects(v, family, family_changed, ids) for v in victims},
        reason=None,
    )
