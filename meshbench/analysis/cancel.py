"""Cancel and retry: does a client that disconnects mid-stream, then sends its request again, change anything?

At one level the first C sessions are submitted together (the reference; a server with fewer slots queues the
rest), then again with every second session cancelled at a token (its client disconnects, as a user who closes
the page) and sent again at once, every request with the server's top-2 log-probabilities. Two comparisons:
- every session that ran through, against the outputs it gave without any cancellation at this level (the
  reference run and the level's timed repetitions: a run-to-run null);
- every retried session, against its cold answer (alone, ``cache_prompt`` false) and those same outputs.
An answer that equals one of them is unaffected. One that equals none is classified by the margin where it first
leaves its reference (a ran-through session) or its cold answer (a retried one), as every divergence of an
endpoint bundle is (meshbench.analysis.endpoint_margins): a near-tie within this run's measured numerics (the
batch changed shape when the cancelled requests left and came back), or a confident divergence, which the
numerics measured here do not explain, as a slot, a cache entry or a KV cell left behind by the cancelled
request would: ``affected``. The threshold is this run's own measurement: a server whose flips exceed what it
showed once can still be called affected, so a confident divergence is a finding to reproduce, named with the
sessions in flight beside it.
"""

from __future__ import annotations

from typing import Sequence

from meshbench.analysis.endpoint_margins import cold_answers as cold_answers  # noqa: F401 - (re-exported)
from meshbench.analysis.endpoint_margins import divergence, overlapping
from meshbench.engine import apis
from meshbench.records.cancel import CancelVerdict
from meshbench.records.completion import CANCELLED, Completion
from meshbench.records.margins import Divergence

Output = tuple[int, ...]


def at_token(setting: int | str, new_tokens: Sequence[int]) -> int | None:
    """The token the cancelled clients disconnect at: the setting, or (auto) half the shortest of the cancelled
    sessions' asked-for answers; None: off, or no answer long enough to cut."""
    if setting == "off" or not new_tokens:
        return None
    at = setting if isinstance(setting, int) else max(1, min(new_tokens) // 2)
    return at if at < min(new_tokens) else None


def cancelled(sessions: Sequence[str]) -> list[str]:
    """Every second session: s1, s3, ..."""
    return [s for k, s in enumerate(sessions) if k % 2 == 1]


def runs_at(c: int, api: str, setting: int | str, new: dict[str, int], sessions: Sequence[str]) -> int | None:
    """The token a level's run cuts at, where it has one: C >= 2, the native API (token ids and margins), not
    off, and an answer long enough to cut (None otherwise)."""
    if c < 2 or not apis.recorded(api).ids:
        return None
    return at_token(setting, [new[s] for s in cancelled(sessions[:c])])


def seen_outputs(repetitions: Sequence[Sequence[Completion]]) -> dict[str, set[Output]]:
    """Each session's outputs in a level's timed repetitions (no cancellation in them)."""
    seen: dict[str, set[Output]] = {}
    for answers in repetitions:
        for x in answers:
            if x.error is None:
                seen.setdefault(x.session_id, set()).add(tuple(x.tokens))
    return seen


def verdict(
    c: int,
    cut: Sequence[Completion],
    reference: Sequence[Completion],
    answers: Sequence[Completion],
    cold: dict[str, Completion],
    seen: dict[str, set[Output]],
    threshold: float,
    sampled: bool = False,
) -> CancelVerdict:
    """The run judged. ``seen``: each session's outputs at this level without a cancellation (the timed
    repetitions; the reference run's are added here). ``sampled``: the tokens were drawn, so a changed answer's
    margin decides nothing: the run is unaffected where nothing changed, else not judged."""
    ref = {x.session_id: x for x in reference}
    cut_ids = {x.session_id for x in cut}
    null = {s: set(v) for s, v in seen.items()}
    for x in reference:
        if x.error is None:
            null.setdefault(x.session_id, set()).add(tuple(x.tokens))
    failed = sum(x.error is not None for x in [*reference, *answers, *cut])
    others: list[Divergence] = []
    retries: list[Divergence] = []
    everyone = [*answers, *cut]
    unjudged = 0
    for x in answers:
        retried = x.session_id in cut_ids
        base = cold.get(x.session_id) if retried else ref.get(x.session_id)
        if x.error is not None or tuple(x.tokens) in null.get(x.session_id, set()):
            continue  # (a failed one is counted in ``failed``)
        if base is None or base.error is not None:
            unjudged += 1  # nothing to judge it against: never a pass
            continue
        if retried and x.tokens == base.tokens:
            continue
        beside = overlapping(x, everyone)
        d = divergence(c, None, x.session_id, x, base, beside, threshold)
        if d is not None:
            (retries if retried else others).append(d)
    kinds = [d.kind for d in [*others, *retries]]
    was_cut = sum(x.stop == CANCELLED for x in cut)
    judged = failed == 0 and was_cut > 0 and "unknown" not in kinds and unjudged == 0
    return CancelVerdict(
        threshold=round(threshold, 6),
        cut=was_cut,
        others_differing=others,
        retries_differing=retries,
        failed=failed,
        affected=(None if kinds else False if judged else None)
        if sampled
        else True
        if "confident" in kinds
        else (False if judged else None),
        unjudged=unjudged or None,
    )
