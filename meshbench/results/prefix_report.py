"""The README's section on a prefix cache: what it saved at each level, and cache equivalence (every
session's tokens equal with the cache on and off), with the first divergence where it does not hold."""

from __future__ import annotations

from meshbench.analysis import prefix
from meshbench.records.model import LevelRecord
from meshbench.results.typed import NodeBundle
from meshbench.workload.workload import Workload


def section(b: NodeBundle) -> list[str]:
    """The section, or nothing without a prefix cache."""
    levels = [lv for lv in b.levels if lv.prefix is not None and lv.cache_verdict is not None]
    if not levels:
        return []
    e, wl = b.cfg.engine, b.cfg.workload
    sharing = (
        f"{len(wl.prefix_groups)} groups of {', '.join(map(str, wl.prefix_groups))} sessions sharing a "
        f"{wl.prefix_tokens}-token prefix"
        if wl.prefix_groups
        else "no prefix shared between sessions: a conversation's later turns hit its own earlier turns' blocks"
        if wl.turns > 1
        else "no shared prefix in the workload (only repeated blocks can hit)"
    )
    talks = wl.turns > 1
    holds = all(lv.cache_verdict.holds for lv in levels if lv.cache_verdict)
    lines = [
        "## Prefix cache",
        "",
        f"Blocks of {e.block_tokens} positions keyed by a chained SHA-256 of their token ids; {sharing}. A hit "
        "is a session whose prompt started from cached blocks; saved = prompt positions taken from the cache, "
        "computed = prompt positions prefilled. Each level ran once more with the cache off: **cache "
        f"equivalence = {holds}** (every session's tokens equal with the cache on and off; a difference is a leak "
        "where isolation fails, engine numerics at a near-tie or where the level replayed on its sessions' own KV "
        "gives the cache's tokens, else corruption, and either of those two leaves corruption_free false).",
        "",
        "| level | hits | misses | prefill computed | saved | peak shared KV (bytes) | cache equivalence |"
        + (" conversation misses |" if talks else ""),
        "|---|---|---|---|---|---|---|" + ("---|" if talks else ""),
    ]
    for lv in levels:
        p, v = lv.prefix, lv.cache_verdict
        assert p is not None and v is not None
        verdict = (
            f"holds ({v.compared} sessions)"
            if v.holds
            else f"fails: {len(v.divergences)} of {v.compared}, {v.classification}"
        )
        lines.append(
            f"| {lv.concurrency} | {p.hits} | {p.misses} | {p.computed_tokens} | {p.saved_tokens} | "
            f"{p.peak_shared_kv_bytes} | {verdict} |" + (f" {p.conversation_misses} |" if talks else "")
        )
    lines += _sharing(b) + _conversations(b, levels, holds) + _own_kv(levels)
    for lv in levels:
        found = lv.cache_verdict.divergences if lv.cache_verdict else []
        first = prefix.first_turns(found)
        for d in found[:8]:
            after = "" if d in first else " (after an earlier turn of it differed: another context without the cache)"
            lines.append(
                f"- level {lv.concurrency}, session {d.session_id} (turn {d.epoch}): token {d.index} is {d.token_on} "
                f"with the cache and {d.token_off} without (margins {_m(d.margin_on)} and {_m(d.margin_off)}){after}"
            )
        if len(found) > 8:
            lines.append(f"- level {lv.concurrency}: {len(found) - 8} more in results.json")
    return [*lines, ""]


def _m(margin: float | None) -> str:
    return "none" if margin is None else f"{margin:.3f}"


def _own_kv(levels: list[LevelRecord]) -> list[str]:
    """What the own-KV replay found, where it ran."""
    ran = [(lv.concurrency, lv.cache_verdict.own_kv) for lv in levels if lv.cache_verdict and lv.cache_verdict.own_kv]
    if not ran:
        return []
    said = [
        f"level {c}: every one of its {r.tokens} tokens reproduced"
        if r.reproduced
        else f"level {c}: not reproduced, first at session {r.session_id} turn {r.epoch} token {r.index}"
        for c, r in ran
    ]
    return [
        "",
        "Where turns differ with the cache on and off, the level was replayed without the cache, each later turn "
        "continuing its own session's llama.cpp sequence cut to the positions the cache gave it (`meshbench.sweep."
        "own_kv`): " + "; ".join(said) + ". Reproduced means each turn's tokens with the cache are those of its "
        "session's own KV, computed as the cache-on run computed it; a turn then differs from its cold prefill "
        "because its cached positions were computed otherwise (its answers by decode, one token at a time, the "
        "rest of its prompt in a prefill of its own; the cold pass prefills the whole context at once): engine "
        "numerics, not what the cache held. Not reproduced is corruption.",
    ]


def _sharing(b: NodeBundle) -> list[str]:
    """How isolation is proven where sessions share a prefix."""
    if not b.cfg.workload.prefix_groups:
        return []
    return [
        "",
        "Isolation under sharing: the perturbation passes treat each group's prefix as one unit, replaced by "
        "the same new tokens for every sharer (the sharing, and so the cache's hits, stay as they were), and "
        "each session's own tokens as another; a session may change only when its own tokens or its group's "
        "prefix did. Each kind of unit has its own separating family, so a pass that tests a unit never "
        "perturbs what the session it tests may depend on; the escape bound counts those passes.",
    ]


def _conversations(b: NodeBundle, levels: list[LevelRecord], holds: bool) -> list[str]:
    """What the cache did for conversations, and conversation equivalence."""
    wl = b.cfg.workload
    if wl.turns <= 1:
        return []
    later = sum(lv.cache_verdict.later_turns or 0 for lv in levels if lv.cache_verdict)
    missed = sum(lv.prefix.conversation_misses or 0 for lv in levels if lv.prefix)
    return [
        "",
        f"Conversations: {wl.turns} turns per session, each later turn's prompt the whole conversation so far "
        f"and {_user_turns(wl)}. A session's whole blocks (prompt and answer) stay cached when a "
        "turn ends, so its next turn starts from them; where they were evicted meanwhile, the context is "
        f"prefilled again (a conversation miss: {missed} over all levels). **Conversation equivalence**: the "
        f"{later} later turns compared (all levels) "
        + ("give" if holds else "are held to")
        + " the tokens of a cold prefill of the whole context (the cache-off pass)"
        + (" at every level." if holds else f"; {_differing(levels)} of them differ, listed below."),
        "",
        "The isolation passes perturb a session's content in every turn (its prompt and its user ids).",
    ]


def _user_turns(wl: Workload) -> str:
    """What each later turn adds: synthetic ids, or the user's next message from the prompts file."""
    if wl.turn_lengths is None:
        return f"{wl.turn_tokens} new user ids"
    sizes = [n for x in wl.turn_lengths for n in x]
    return (
        f"the user's next message from `{wl.prompts}` (its 'turns', {min(sizes)} to {max(sizes)} tokens, "
        "tokenized without BOS)"
    )


def _differing(levels: list[LevelRecord]) -> int:
    return sum(1 for lv in levels if lv.cache_verdict for d in lv.cache_verdict.divergences if d.epoch > 1)
