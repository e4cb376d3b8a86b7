"""Isolation proven by perturbation: no session's output depends on another session's content.

A level is run again with the prompts of some sessions replaced by other tokens of the same lengths.
The lengths stay, so the schedule must stay: every tick record (the decode feed reduced to sessions
and positions) must equal the level's. Every session that was not perturbed must then give the same
tokens AND the same margins, bit for bit: margins catch a contamination that does not flip a token.

Which sessions each pass perturbs is a separating family: session i gets a distinct subset S_i of
the m passes, and pass p perturbs every i with p in S_i. For every ordered pair (i, j), S_j is not
inside S_i, so some pass perturbs j and not i. The config's ``isolation_family`` says which family:
``repeated``, subsets of size floor(m/2) (C(m, floor(m/2)) >= N: 6 passes for 16 sessions, 8 for 64)
run ``rounds`` times; or ``constant-weight`` (meshbench.analysis.spread_code), one code in which every
ordered pair is separated by at least ``rounds`` passes, in fewer passes (16 sessions: 10 for 2
rounds' worth, not 12; 16 for 4, not 24). Both test every pair at least ``rounds`` times.

Every perturbed session gets fresh random content in every pass (seeded by the workload seed, the
pass and the session), so a dependence on any feature of a neighbour's content is caught with a
stated probability rather than missed for good: a dependence of session i on one bit of session j's
content (a parity, a token's low bit) flips with probability 1/2 in each pass that perturbs j and
not i, and escapes all n such passes with probability 2^-n. ``escape_bits`` is the smallest n over
the ordered pairs: the bound a level states. A session that changed is then tested against each
suspect alone (up to CONFIRM_TRIES fresh passes per suspect), so a leak is reported with both
sessions named.

End of sequence: a perturbed session is pinned to its length in the level (``end_at``), stop
tokens or not, so its neighbours see the same schedule; one that did not complete there (evicted
under KV pressure, a conversation's turn among them) is pinned to its whole length, so the node ends
it where it did; an unperturbed one keeps the workload's eos policy and must end where it ended.
The proof is about content: it cannot see a dependence on a neighbour's length or timing, which
the schedule fixes.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
from typing import Sequence

import numpy as np

from meshbench.analysis import spread_code
from meshbench.records import serial
from meshbench.records.model import (
    IsolationPass,
    IsolationRecords,
    IsolationVerdict,
    JsonObject,
    LevelRecord,
    PassSession,
    SessionRecord,
)
from meshbench.records.tick import Tick
from meshbench.scheduler.session import GenerationRequest

Groups = dict[str, list[str]]  # a shared prefix's unit name ("prefix:G") -> the sessions whose prompts start with it

_PERTURBED = (
    "perturbation: the level rerun with the prompt content of chosen sessions replaced by fresh random "
    "tokens in every pass (same lengths, so the same schedule, checked tick by tick); every other session's "
    "tokens and margins compared bit for bit; perturbed sets form a separating family (every ordered pair "
    "(i, j) has a pass perturbing j and not i), "
)
_ESCAPE = (
    "; a dependence on one bit of a neighbour's content escapes n passes with probability 2^-n; a changed "
    "session is confirmed against each suspect alone"
)
REPEATED, CONSTANT_WEIGHT = "repeated", "constant-weight"
FAMILIES = (CONSTANT_WEIGHT, REPEATED)
METHODS = {
    REPEATED: _PERTURBED + "run in rounds" + _ESCAPE,
    CONSTANT_WEIGHT: _PERTURBED + "a constant-weight code separating every ordered pair in at least `rounds` "
    "passes" + _ESCAPE,
}
MAX_CONFIRMATIONS = 16  # suspects confirmed per level at most
CONFIRM_TRIES = 4  # fresh single-suspect passes per suspect, until one of its victims changes


def pass_count(sessions: int) -> int:
    """The fewest passes m whose subsets of size floor(m/2) number at least ``sessions`` (0 for one session)."""
    return spread_code.once(sessions)


def perturbed_sets(ids: Sequence[str]) -> list[list[str]]:
    """The sessions each pass perturbs: session k takes the k-th subset (lexicographic) of size floor(m/2)."""
    m = pass_count(len(ids))
    subsets = list(itertools.islice(itertools.combinations(range(m), m // 2), len(ids)))
    return [[sid for sid, sub in zip(ids, subsets) if p in sub] for p in range(m)]


def prefix_groups(groups: Sequence[Sequence[str]]) -> Groups | None:
    """The perturbation units of shared prefixes: one per group of sessions sharing one (None: no sharing)."""
    return {f"prefix:{g}": list(members) for g, members in enumerate(groups)} or None


def exposure(session: str, groups: Groups | None) -> set[str]:
    """The units whose perturbation may change ``session``: its own content, and its group's prefix."""
    return {session, *(u for u, members in (groups or {}).items() if session in members)}


def allowed(perturbed: Sequence[str], groups: Groups | None) -> set[str]:
    """The sessions a pass may change: those perturbed, and every sharer of a perturbed prefix."""
    return {*perturbed, *(s for u in perturbed for s in (groups or {}).get(u, ()))}


def spread_sets(ids: Sequence[str], rounds: int) -> list[list[str]]:
    """The sessions each pass perturbs, every ordered pair separated by at least ``rounds`` passes: the
    constant-weight code (session k takes its k-th word), or the once-through family ``rounds`` times over
    where the code is no shorter."""
    code = spread_code.lexicode(len(ids), rounds)
    if code is None:
        return perturbed_sets(ids) * rounds
    m, words = code
    return [[sid for sid, word in zip(ids, words) if word >> p & 1] for p in range(m)]


def family_sets(ids: Sequence[str], rounds: int, groups: Groups | None, family: str) -> list[list[str]]:
    """The family's passes (fresh content in each pass): the separating family of the sessions' own content,
    then (with shared prefixes) that of the groups' prefixes, so that a pass testing one unit never perturbs
    what the session it tests may depend on. ``repeated``: the once-through families, ``rounds`` times over;
    ``constant-weight``: each unit kind's code separating every pair ``rounds`` times."""
    units = list(groups or {})
    if family == REPEATED:
        return (perturbed_sets(ids) + perturbed_sets(units)) * rounds
    if family == CONSTANT_WEIGHT:
        return spread_sets(ids, rounds) + spread_sets(units, rounds)
    raise ValueError(f"isolation family {family!r} is not one of {', '.join(FAMILIES)}")


def _pairs(ids: Sequence[str], groups: Groups | None) -> list[tuple[str, set[str], str]]:
    """Every (session i, the units it depends on, a unit j it must not depend on)."""
    units = [*ids, *(groups or {})]
    out: list[tuple[str, set[str], str]] = []
    for i in ids:
        own = exposure(i, groups)
        out.extend((i, own, j) for j in units if j not in own)
    return out


def escape_bits(ids: Sequence[str], sets: Sequence[Sequence[str]], groups: Groups | None = None) -> int | None:
    """The fewest passes that perturb j and nothing i depends on, over the pairs (session i, unit j): a one-bit
    dependence escapes every pass with probability 2^-escape_bits (None for a single session: no pair)."""
    counts = [sum(1 for s in sets if j in s and not own & set(s)) for _, own, j in _pairs(ids, groups)]
    return min(counts) if counts else None


def separates(ids: Sequence[str], sets: Sequence[Sequence[str]], groups: Groups | None = None) -> bool:
    """Every pair (session i, unit j it must not depend on) has a set holding j and nothing i depends on."""
    return all(any(j in s and not own & set(s) for s in sets) for _, own, j in _pairs(ids, groups))


def perturb(prompt: Sequence[int], vocab_size: int, seed: int, index: int, pass_no: int) -> tuple[int, ...]:
    """Other tokens of the same length: every position moved by a nonzero offset, drawn afresh for every
    session in every pass."""
    rng = np.random.default_rng([seed, pass_no, index, 0x150])
    offsets = rng.integers(1, vocab_size, len(prompt))  # (prompt,): never 0, so every token changes
    return tuple(int((t + o) % vocab_size) for t, o in zip(prompt, offsets))


def requests_for(
    requests: Sequence[GenerationRequest],
    perturbed: Sequence[str],
    baseline: dict[tuple[str, int], SessionRecord],
    vocab_size: int,
    seed: int,
    pass_no: int,
    groups: Groups | None = None,
    shared: int = 0,
) -> list[GenerationRequest]:
    """The pass's requests: perturbed sessions with other prompt content, pinned to their baseline length (each
    turn to its own: ``baseline`` is the level's records by (session, turn)). With
    shared prefixes (``groups``, of ``shared`` tokens), a session's own content is the rest of its prompt, and a
    perturbed prefix is replaced the same way for every sharer: the sharing stays as it was."""
    out = []
    heads = {s: g for g, u in enumerate(groups or {}) if u in perturbed for s in (groups or {})[u]}
    for k, r in enumerate(requests):
        head, own = r.prompt_tokens[:shared], r.prompt_tokens[shared:]
        if r.session_id in heads:
            head = perturb(head, vocab_size, seed, 1_000_000 + heads[r.session_id], pass_no)
        turns = r.turns
        if r.session_id in perturbed:
            own = perturb(own, vocab_size, seed, k, pass_no)
            # a conversation's content is every turn's: each later turn's user ids are replaced too
            turns = tuple(perturb(t, vocab_size, seed, k + 1_000 * (j + 1), pass_no) for j, t in enumerate(turns))
        if r.session_id in heads or r.session_id in perturbed:
            r = dataclasses.replace(r, prompt_tokens=head + own, turns=turns)
            if (r.session_id, 1) in baseline:  # (one the level refused is refused again: same lengths, same queue)
                pins = [baseline.get((r.session_id, t)) for t in range(1, len(r.turns) + 2)]
                ends = [r.max_new_tokens if s is None else pinned_length(s, r) for s in pins]
                r = dataclasses.replace(r, end_at=ends[0], turn_end_at=tuple(ends[1:]))
        out.append(r)
    return out


def pinned_length(first: SessionRecord, request: GenerationRequest) -> int:
    """Where a perturbed session (a conversation's turn) ends, stop tokens or not: its length in the level if it
    completed there; else its whole ``max_new_tokens``, so it ends where the node ends it (evicted, cancelled,
    failed) at the same tick as in the level, rather than completing one tick before."""
    if first.done_reason == "COMPLETED":
        return max(len(first.tokens), 1)
    return request.max_new_tokens


def schedule_view(ticks: Sequence[Tick]) -> list[JsonObject]:
    """Deterministic tick records as results.json holds them, the decode feed reduced to (session, position):
    the schedule. With a prefix cache its hits and bytes, and the KV bytes held (which count them), are left out:
    they depend on content by design (two prompts share a block exactly when their ids do), and perturbed content
    may share a block by chance; the positions held (stored_tokens) stay."""
    shared = ("prefix_hit_tokens", "kv_bytes_shared", "kv_bytes")
    return [
        {
            **{k: v for k, v in serial.to_json(t).items() if t.kv_bytes_shared is None or k not in shared},
            "decode_feed": [f[:2] for f in t.decode_feed],
        }
        for t in ticks
    ]


def digest(value: object) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, allow_nan=False).encode()).hexdigest()


def pass_record(
    perturbed: Sequence[str], ticks: Sequence[Tick], sessions: Sequence[SessionRecord], confirm: bool
) -> IsolationPass:
    """One perturbation pass as results.json holds it: whom it perturbed, its schedule's digest, and each
    session's token and margin digests."""
    turns = any(s.epoch > 1 for s in sessions)  # a conversation's turns are told apart by their epochs
    return IsolationPass(
        perturbed=list(perturbed),
        confirm=confirm,
        schedule_digest=digest(schedule_view(ticks)),
        sessions=[
            PassSession(
                session_id=s.session_id,
                digest=s.digest,
                margins_digest=digest(s.margins),
                epoch=s.epoch if turns else None,
            )
            for s in sessions
        ],
    )


def changed(sessions: Sequence[SessionRecord], p: IsolationPass, groups: Groups | None = None) -> list[str]:
    """Sessions the pass may not change (``allowed``) whose tokens or margins differ from the level's
    ``sessions``."""
    base = {(s.session_id, s.epoch): (s.digest, digest(s.margins)) for s in sessions}
    free = allowed(p.perturbed, groups)
    return sorted(
        {
            s.session_id
            for s in p.sessions
            if s.session_id not in free and base.get((s.session_id, s.epoch or 1)) != (s.digest, s.margins_digest)
        }
    )


def suspects(
    victim: str,
    family: Sequence[IsolationPass],
    changed_in: Sequence[list[str]],
    ids: Sequence[str],
    groups: Groups | None = None,
) -> list[str]:
    """What ``victim`` may depend on: the units (sessions, shared prefixes) perturbed in every family pass where
    it changed, or, where none was (it depends on several), every unit perturbed in any of them. Random content
    need not flip a dependence, so a pass where the victim held acquits no one."""
    own = exposure(victim, groups)
    hits = [set(p.perturbed) for p, c in zip(family, changed_in) if victim in c]
    if not hits:
        return []
    common = set.intersection(*hits)
    return [j for j in [*ids, *(groups or {})] if j not in own and j in (common or set.union(*hits))]


def culprits(
    sessions: Sequence[SessionRecord],
    family: Sequence[IsolationPass],
    ids: Sequence[str],
    groups: Groups | None = None,
) -> dict[str, set[str]]:
    """The suspects to confirm, sessions then prefixes (at most MAX_CONFIRMATIONS), each with the victims it is
    suspected of."""
    changed_in = [changed(sessions, p, groups) for p in family]
    blamed = {v: suspects(v, family, changed_in, ids, groups) for c in changed_in for v in c}
    units = [*ids, *(groups or {})]
    order = list(dict.fromkeys(j for j in units for v in sorted(blamed) if j in blamed[v]))[:MAX_CONFIRMATIONS]
    return {j: {v for v in blamed if j in blamed[v]} for j in order}


def expected_confirmations(level: LevelRecord) -> list[list[str]]:
    """The confirmation passes the method prescribes, given the recorded passes' outcomes: for each culprit in
    order, single-suspect passes until one changes a victim of it, CONFIRM_TRIES at most."""
    passes = level.isolation.passes or []
    groups = level.isolation.groups
    family = [p for p in passes if not p.confirm]
    recorded = iter(p for p in passes if p.confirm)
    out: list[list[str]] = []
    for j, victims in culprits(level.sessions, family, level.isolation.sessions or [], groups).items():
        for _ in range(CONFIRM_TRIES):
            out.append([j])
            p = next(recorded, None)
            if p is None or victims & set(changed(level.sessions, p, groups)):
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
    passes, groups = records.passes, records.groups
    schedule = [k for k, p in enumerate(passes) if p.schedule_digest != base]
    changed_in = [changed(sessions, p, groups) for p in passes]
    leaks = sorted({(victim, p.perturbed[0]) for p, c in zip(passes, changed_in) if p.confirm for victim in c})
    victims = sorted({v for c in changed_in for v in c})
    ids = records.sessions or []  # every arrival, served or refused
    family = [p for p in passes if not p.confirm]
    family_changed = [changed(sessions, p, groups) for p in family]
    return IsolationVerdict(
        ran=True,
        holds=not schedule and not victims,
        schedule_changed=schedule,
        changed=victims,
        leaks=[list(x) for x in leaks],
        separating=separates(ids, [p.perturbed for p in family], groups),
        family_passes=len(family),
        escape_bits=escape_bits(ids, [p.perturbed for p in family], groups),
        confirmations=len(passes) - len(family),
        suspects={v: suspects(v, family, family_changed, ids, groups) for v in victims},
        reason=None,
    )
