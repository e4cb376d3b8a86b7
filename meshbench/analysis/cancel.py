"""Cancel and retry: does a client that disconnects mid-stream, then sends its request again, change anything?

At one level the first C sessions are sent at once (the reference), then again with every second session
cancelled at a token (its client disconnects, as a user who closes the page) and retried at once, every request
with the server's top-2 log-probabilities. Two comparisons, each divergence classified by the margin where it
first differs, as every divergence of an endpoint bundle is (meshbench.analysis.endpoint_margins):
- every session that ran through, against its own reference answer: what the cancellations did to the others
  (the reference's margin there);
- every retried session, against its cold answer (alone, ``cache_prompt`` false): whether the retry answers
  as the request does on a fresh server (the cold answer's margin there).
A near-tie is numerics (the batch changed shape when the cancelled requests left and came back); a confident
divergence is what numerics do not explain, as a slot, a cache entry or a cell left behind by the cancelled
request would: ``affected``.
"""

from __future__ import annotations

from typing import Sequence

from meshbench.analysis.endpoint_margins import divergence
from meshbench.records.cancel import CancelVerdict
from meshbench.records.completion import Completion
from meshbench.records.margins import Divergence


def at_token(setting: int | str, new_tokens: Sequence[int]) -> int | None:
    """The token the cancelled clients disconnect at: the setting, or (auto) half the shortest of the cancelled
    sessions' answers; None: off, or no answer long enough to cut."""
    if setting == "off" or not new_tokens:
        return None
    at = setting if isinstance(setting, int) else max(1, min(new_tokens) // 2)
    return at if at < min(new_tokens) else None


def cancelled(sessions: Sequence[str]) -> list[str]:
    """Every second session: s1, s3, ..."""
    return [s for k, s in enumerate(sessions) if k % 2 == 1]


def verdict(
    c: int,
    cut: Sequence[str],
    reference: Sequence[Completion],
    answers: Sequence[Completion],
    cold: dict[str, Completion],
    threshold: float,
) -> CancelVerdict:
    """The run judged: the others against their reference answers, the retried against their cold ones (where a
    session has none, its reference answer)."""
    ref = {x.session_id: x for x in reference}
    failed = sum(x.error is not None for x in [*reference, *answers])
    others: list[Divergence] = []
    retries: list[Divergence] = []
    for x in answers:
        base = cold.get(x.session_id, ref.get(x.session_id)) if x.session_id in cut else ref.get(x.session_id)
        if x.error is not None or base is None or base.error is not None:
            continue
        beside = sorted(cut) if x.session_id not in cut else sorted(s for s in ref if s != x.session_id)
        d = divergence(c, None, x.session_id, x, base, beside, threshold)
        if d is not None:
            (retries if x.session_id in cut else others).append(d)
    kinds = [d.kind for d in [*others, *retries]]
    affected = True if "confident" in kinds else None if failed or "unknown" in kinds else False
    return CancelVerdict(
        threshold=round(threshold, 6),
        others_differing=others,
        retries_differing=retries,
        failed=failed,
        affected=affected,
    )
