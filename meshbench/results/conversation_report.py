"""The README section of an endpoint bundle's conversations (workload.turns > 1): how the turns were sent, which
later turns differ from the reference level's, and the later turns against the same request sent cold."""

from __future__ import annotations

from meshbench.engine import apis, servers
from meshbench.records.margins import Divergence
from meshbench.results.typed import EndpointBundle


def section(b: EndpointBundle) -> list[str]:
    r = b.results
    turns, cold = r.workload.turns, r.conversations
    if turns is None or cold is None:
        return []
    how = (
        "the last turn's prompt ids, its answer's ids, then the user's next turn as the server tokenizes it, nothing "
        "special added (`/completion`)"
        if apis.recorded(r.endpoint.api).ids
        else "the messages so far, the answer as the assistant's message, then the user's next turn "
        "(`/v1/chat/completions`)"
    )
    rows = []
    for lv in r.levels:
        later = [x for rep in lv.repetitions for x in rep.turns or ()]
        differing = [s for s in r.verdicts.differing_sessions.get(lv.concurrency, []) if "#t" in s]
        inherited = [s for s in differing if _after_a_difference(s, r.verdicts.differing_sessions[lv.concurrency])]
        failed = sum(x.error is not None for x in later)
        rows.append(f"| {lv.concurrency} | {len(later)} | {failed} | {len(differing)} | {len(inherited)} | "
                    f"{', '.join(differing[:8]) + (' ...' if len(differing) > 8 else '') or '-'} |")  # fmt: skip
    return [
        "## Conversations",
        "",
        f"Each session is a conversation of {turns} turns. Once a turn is answered, its client sends the next at "
        f"once, its prompt the whole conversation so far: {how}. The server's prompt cache can serve a later turn's "
        "earlier part from the slot that ran the turn before it. The figures and verdicts above count every turn, "
        "named `s0#t2` for s0's second turn; the needle, the margin passes, the perturbation, canary and cancel runs "
        "send first turns only. A later turn differs from the reference's either by itself or because an earlier "
        "turn of its conversation differed in the same pass (then its prompt is another)."
        + (
            " Over chat a turn's prompt length counts the messages' tokens (the first prompt, the answers, the "
            "turns), not the chat template's, as the first turn's does."
            if apis.recorded(r.endpoint.api).messages
            else ""
        ),
        "",
        "| C | later turns sent (all repetitions) | failed | later turns differing from C=ref (first repetition) "
        "| of them after an earlier turn differed | which |",
        "|---|---|---|---|---|---|",
        *rows,
        "",
        _cold(b),
        "",
    ]


def _after_a_difference(name: str, differing: list[str]) -> bool:
    sid, turn = name.split("#t")
    return sid in differing or any(f"{sid}#t{k}" in differing for k in range(2, int(turn)))


def _cold(b: EndpointBundle) -> str:
    r = b.results
    cold = r.conversations
    assert cold is not None
    ref = min(r.levels, key=lambda lv: lv.concurrency).repetitions[0].turns or []
    failed_warm = sum(x.error is not None for x in ref)
    failed_cold = sum(x.error is not None for x in cold.cold)
    compared = len(cold.cold) - failed_cold
    how = "with `cache_prompt` false and the top-2 log-probabilities per token"
    own = (
        ""
        if servers.recorded(r.endpoint.server).cache_prompt or r.workload.sessions < 2
        else " A server that ignores `cache_prompt` (llama-cpp-python's does) may still reuse a start the sessions "
        "share: they were sent turn by turn, none right after its own conversation's last turn."
    )
    head = (
        f"**Warm against cold.** Every later turn concurrency {cold.concurrency}'s first repetition answered "
        f"({len(cold.cold)} of {len(ref)}) was sent again alone, the same request {how}: nothing of its "
        f"conversation taken from the server's prompt cache.{own}"
    )
    if failed_warm or failed_cold:
        head += (
            f" Not compared: {failed_warm} turn(s) that failed in their conversation and {failed_cold} cold "
            "re-send(s) that failed."
        )
    if not cold.differing:
        return head + f" Every one of the {compared} compared gave the answer it gave in its conversation."
    found = ", ".join(_where(d) for d in cold.divergences or []) or ", ".join(cold.differing)
    return (
        head + f" {len(cold.differing)} of the {compared} compared answer otherwise cold than in conversation: {found}."
    )


def _where(d: Divergence) -> str:
    margin = "" if d.margin is None else f", margin {d.margin:.3g}"
    return f"{d.session_id} (token {d.token_index}, {d.kind}{margin})"
