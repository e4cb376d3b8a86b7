"""An endpoint bundle's conversations checked from its records (workload.turns > 1): each pass's later turns,
every one after the turn before it was answered and none after a failed one, each prompt's length as the
conversation so far, and the cold pass recomputed (meshbench.endpoint.conversation_passes)."""

from __future__ import annotations

from meshbench.analysis import conversation as talk
from meshbench.analysis import endpoint as figures
from meshbench.analysis import endpoint_margins
from meshbench.analysis.checks import Checks
from meshbench.engine import apis
from meshbench.names import RESULTS
from meshbench.records.completion import CANCELLED
from meshbench.records.model import Completion, EndpointRepetition
from meshbench.results.typed import EndpointBundle
from meshbench.verify.endpoint_proofs import margined, older, whole


def turn_ids(b: EndpointBundle) -> dict[str, list[list[int]]] | None:
    """Each session's later turns' ids, by session (None: one turn each)."""
    wl = b.results.workload
    return None if wl.turn_ids is None else dict(zip(b.cfg.workload.session_ids(), wl.turn_ids))


def lengths(b: EndpointBundle, answers: list[Completion]) -> tuple[dict[str, int], dict[str, int]]:
    """Each answer's prompt length and asked-for new tokens, by its name (meshbench.analysis.conversation)."""
    wl, ids = b.results.workload, b.cfg.workload.session_ids()
    first, new = dict(zip(ids, wl.prompt_tokens)), dict(zip(ids, wl.new_tokens))
    return talk.prompt_lengths(first, turn_ids(b), answers), talk.new_tokens(new, answers)


def check_conversations(c: Checks, b: EndpointBundle, passes: list[tuple[str, EndpointRepetition]]) -> None:
    wl, cfg = b.results.workload, b.cfg.workload
    turns = cfg.turns if cfg.turns > 1 else None
    c.equal(RESULTS, "workload.turns (= config.workload.turns, where more than one)", turns, wl.turns)
    shape = None if wl.turn_ids is None else [len(x) for x in wl.turn_ids]
    c.equal(RESULTS, "workload.turn_ids (each session's later turns)",
            None if turns is None else [turns - 1] * wl.sessions, shape)  # fmt: skip
    api = b.results.endpoint.api
    for at, rep in passes:
        c.equal(RESULTS, f"{at}.turns (recorded in conversations only)", turns is not None, rep.turns is not None)
        c.equal(RESULTS, f"{at}.sessions (first turns: no turn number)", [], [x.turn for x in rep.sessions if x.turn])
        if turns is not None and rep.turns is not None:
            _check_pass(c, at, rep, turns, api)
            if apis.recorded(api).ids:
                _check_accounted(c, at, [*rep.sessions, *rep.turns])
    _check_cold(c, b)


def _check_accounted(c: Checks, at: str, answers: list[Completion]) -> None:
    """Over llama-server's native API every answer says what it evaluated and computed: in a conversation each
    prompt's length and the server's accounting rest on them, so none may leave them out."""
    unsaid = [talk.label(x) for x in answers if x.error is None and (x.evaluated is None or x.computed is None)]
    c.equal(RESULTS, f"{at}: every answer's evaluated and computed prompt tokens (the native API says them)", [],
            unsaid)  # fmt: skip


def _check_pass(c: Checks, at: str, rep: EndpointRepetition, turns: int, api: str) -> None:
    """A pass's later turns: each session's turns 2, 3, ... in session order, each sent after the answer before it
    was whole (every id it generated, to send back), and none after a failed or cut turn."""
    last = {x.session_id: x for x in rep.sessions}
    expected, found = [], [talk.label(x) for x in rep.turns or ()]
    for x in rep.sessions:
        before = x
        for t in range(2, turns + 1):
            if before.error is not None or before.stop == CANCELLED:
                break
            expected.append(f"{x.session_id}#t{t}")
            nxt = next((y for y in rep.turns or () if y.session_id == x.session_id and y.turn == t), None)
            if nxt is None:
                break
            before = nxt
    c.equal(RESULTS, f"{at}.turns (each conversation's later turns in order, none after a failed one)", expected, found)
    for y in rep.turns or ():
        prior = last.get(y.session_id)
        if prior is not None:
            done = prior.token_ns[-1] if prior.token_ns else prior.submit_ns
            c.equal(RESULTS, f"{at}.{talk.label(y)}: sent after the turn before it was answered", True,
                    y.submit_ns >= done)  # fmt: skip
            if y.error is None:
                c.equal(RESULTS, f"{at}.{talk.label(y)}: sent after a turn it could send back whole", None,
                        talk.unsendable(api, prior))  # fmt: skip
        last[y.session_id] = y


def _check_cold_answer(c: Checks, b: EndpointBundle, x: Completion, prompt: int, new: int) -> None:
    """A cold re-send: answered, whole as a margin pass's answer is (its stamps, every token asked, its prompt the
    conversation so far), one margin per token where the server gave them, and nothing taken from the server's
    prompt cache where the server says what it computed."""
    where = f"conversations.cold.{talk.label(x)}"
    c.equal(RESULTS, f"{where}: answered", "answered", "answered" if x.error is None else x.error)
    if x.error is not None:
        return
    api = b.results.endpoint.api
    whole(c, where, x, prompt, new, b.results.workload.eos, text=not apis.recorded(api).ids)
    if x.margins is not None or x.token_bytes is not None or apis.recorded(api).ids:  # (a server may give no logprobs)
        margined(c, where, x, api, older(b))
    if apis.recorded(api).ids:  # (llama-server says what it evaluated and computed: cold means every token computed)
        c.equal(RESULTS, f"{where}: every prompt token computed (cache_prompt false)", x.evaluated, x.computed)


def _check_cold(c: Checks, b: EndpointBundle) -> None:
    """The cold pass: every later turn of the reference pass once, in order, and the differing turns recomputed."""
    r = b.results
    if r.workload.turns is None:
        c.equal(RESULTS, "conversations (a cold pass only in conversations)", None, r.conversations)
        return
    ref = min(r.levels, key=lambda lv: lv.concurrency)
    rep = ref.repetitions[0]
    warm = rep.turns or []
    cold = r.conversations
    c.equal(RESULTS, "conversations (the cold pass: recorded)", True, cold is not None)
    if cold is None:
        return
    c.equal(RESULTS, "conversations.concurrency (the reference level)", ref.concurrency, cold.concurrency)
    order = {s: k for k, s in enumerate(b.cfg.workload.session_ids())}
    sent = sorted((x for x in warm if x.error is None), key=lambda x: (x.turn or 1, order.get(x.session_id, 0)))
    c.equal(RESULTS, "conversations.cold (every later turn the reference pass answered, once, turn by turn)",
            [talk.label(x) for x in sent], [talk.label(x) for x in cold.cold])  # fmt: skip
    by_turn, asked = lengths(b, figures.pass_answers(rep))
    for x in cold.cold:
        _check_cold_answer(c, b, x, by_turn.get(talk.label(x), 0), asked.get(talk.label(x), 0))
    compared = figures.compared_by(r.endpoint.api, [*warm, *cold.cold])
    threshold = endpoint_margins.near_tie(r.margins)
    classify = endpoint_margins.compares(r.endpoint.api, compared, b.cfg.engine.temperature)
    differing, found = talk.cold_divergences(warm, cold.cold, ref.concurrency, threshold, classify)
    c.equal(RESULTS, "conversations.differing (recomputed from the cold pass)", differing, cold.differing)
    c.equal(RESULTS, "conversations.divergences (recomputed from the cold pass)", found, cold.divergences)
