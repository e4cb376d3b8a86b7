"""The endpoint's cancel-and-retry runs, checked from the bundle: each level's run where the config asks for one
(its sessions, the cancelled ones, the token they disconnect at), every answer whole, each cut attempt cut at the
first chunk that reached the token (or ended before it), each retry sent after its cut, and the verdict
recomputed from the answers, the level's repetitions and the margin passes.

What verify cannot see without the server: which of two recorded answers came from which run, and whether the
margins are the server's own numbers."""

from __future__ import annotations

from typing import Any

from meshbench.analysis import cancel as judge
from meshbench.analysis import endpoint_margins
from meshbench.analysis.checks import Checks
from meshbench.names import RESULTS
from meshbench.records.cancel import CancelRun
from meshbench.records.completion import CANCELLED, Completion
from meshbench.results.typed import EndpointBundle
from meshbench.verify.endpoint_proofs import whole


def check_cancels(c: Checks, b: EndpointBundle, ids: list[str]) -> None:
    r, wl = b.results, b.results.workload
    new, lengths = dict(zip(ids, wl.new_tokens)), dict(zip(ids, wl.prompt_tokens))
    cold, threshold = judge.cold_answers(r.margins), endpoint_margins.near_tie(r.margins)
    for i, lv in enumerate(r.levels):
        at, sessions = f"levels[{i}].cancel", ids[: lv.concurrency]
        token = judge.runs_at(lv.concurrency, r.endpoint.api, b.cfg.workload.cancel, new, ids)
        c.equal(RESULTS, f"{at} (a run at every native level of C >= 2, unless workload.cancel is off)",
                token is not None, lv.cancel is not None)  # fmt: skip
        if lv.cancel is None or token is None:
            continue
        run = lv.cancel
        c.equal(RESULTS, f"{at}: its sessions, the cancelled ones (every second) and the token they cut at",
                [sessions, judge.cancelled(sessions), token], [run.sessions, run.cancelled, run.at_token])  # fmt: skip
        _answers(c, run, at, lengths, new, wl.eos)
        _cuts(c, run, at, lengths, new, wl.eos)
        seen = judge.seen_outputs([rep.sessions for rep in lv.repetitions])
        c.equal(RESULTS, f"{at}.verdict (recomputed from the answers, the repetitions and the margin passes)",
                judge.verdict(lv.concurrency, run.cut, run.reference, run.answers, cold, seen, threshold,
                              bool(b.cfg.engine.temperature)),
                run.verdict)  # fmt: skip


def _answers(c: Checks, run: CancelRun, at: str, lengths: dict[str, Any], new: dict[str, Any], eos: str) -> None:
    """The reference and the run answer every session in order, whole, with a margin per token."""
    for side, answers in (("reference", run.reference), ("answers", run.answers)):
        c.equal(RESULTS, f"{at}.{side} (every session once, in order)", run.sessions, [x.session_id for x in answers])
        for x in answers:
            if x.error is None and x.session_id in new:
                where = f"{at}.{side}.{x.session_id}"
                whole(c, where, x, lengths[x.session_id], new[x.session_id], eos)
                c.equal(RESULTS, f"{where}: one margin per token, or none (a server without log-probabilities)",
                        True, x.margins is None or len(x.margins) == len(x.tokens))  # fmt: skip


def _cuts(c: Checks, run: CancelRun, at: str, lengths: dict[str, Any], new: dict[str, Any], eos: str) -> None:
    """Each cancelled session's first attempt: cut at the first chunk that reached the token (its stamps say where
    each chunk ended), or a whole answer that ended before it; its retry sent after it."""
    c.equal(RESULTS, f"{at}.cut (each cancelled session once, in order)", run.cancelled,
            [x.session_id for x in run.cut])  # fmt: skip
    retried = {x.session_id: x for x in run.answers}
    for x in run.cut:
        if x.error is not None or x.session_id not in new:
            continue
        where = f"{at}.cut.{x.session_id}"
        stamps = [x.submit_ns, *x.token_ns]
        c.equal(RESULTS, f"{where}.token_ns (in order, after submit_ns; one per token id)", [True, len(x.tokens)],
                [stamps == sorted(stamps), len(x.token_ns)])  # fmt: skip
        if x.stop == CANCELLED:
            before_last_chunk = sum(t < x.token_ns[-1] for t in x.token_ns) if x.token_ns else 0
            c.equal(RESULTS, f"{where}: cut at the first chunk that reached token {run.at_token}", True,
                    before_last_chunk < run.at_token <= len(x.tokens) <= new[x.session_id])  # fmt: skip
        else:
            whole(c, where, x, lengths[x.session_id], new[x.session_id], eos)
            c.equal(RESULTS, f"{where}: ended before token {run.at_token} (eos)", True, len(x.tokens) < run.at_token)
        again = retried.get(x.session_id)
        if again is not None:
            c.equal(RESULTS, f"{at}.answers.{x.session_id}: sent after its cut attempt's last token", True,
                    again.submit_ns >= _last(x))  # fmt: skip


def _last(x: Completion) -> int:
    return x.token_ns[-1] if x.token_ns else x.submit_ns
