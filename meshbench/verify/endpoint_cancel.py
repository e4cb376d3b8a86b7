"""The endpoint's cancel-and-retry runs, checked from the bundle: each level's run where the config asks for one
(its sessions, the cancelled ones, the token they disconnect at), every answer whole, each cut attempt cut where
it says, and the verdict recomputed from the answers and the margin passes."""

from __future__ import annotations

from meshbench.analysis import cancel as judge
from meshbench.analysis import endpoint_margins
from meshbench.analysis.checks import Checks
from meshbench.names import RESULTS
from meshbench.records.cancel import CancelRun
from meshbench.records.completion import CANCELLED
from meshbench.results.typed import EndpointBundle
from meshbench.verify.endpoint_proofs import whole


def check_cancels(c: Checks, b: EndpointBundle, ids: list[str]) -> None:
    r, wl = b.results, b.results.workload
    new, lengths = dict(zip(ids, wl.new_tokens)), dict(zip(ids, wl.prompt_tokens))
    cold = {x.session_id: x for x in r.margins.cold if x.error is None} if r.margins is not None else {}
    threshold = endpoint_margins.near_tie(r.margins)
    for i, lv in enumerate(r.levels):
        at, sessions = f"levels[{i}].cancel", ids[: lv.concurrency]
        cut = judge.cancelled(sessions)
        token = judge.at_token(b.cfg.workload.cancel, [new[s] for s in cut])
        expected = lv.concurrency > 1 and r.endpoint.api == "native" and token is not None
        c.equal(RESULTS, f"{at} (a run at every native level of C >= 2, unless workload.cancel is off)",
                expected, lv.cancel is not None)  # fmt: skip
        if lv.cancel is None or token is None:
            continue
        run = lv.cancel
        c.equal(RESULTS, f"{at}: its sessions, the cancelled ones (every second) and the token they cut at",
                [sessions, cut, token], [run.sessions, run.cancelled, run.at_token])  # fmt: skip
        _answers(c, run, at, lengths, new, wl.eos)
        c.equal(RESULTS, f"{at}.verdict (recomputed from the answers and the margin passes)",
                judge.verdict(lv.concurrency, run.cancelled, run.reference, run.answers, cold, threshold),
                run.verdict)  # fmt: skip


def _answers(c: Checks, run: CancelRun, at: str, lengths: dict, new: dict, eos: str) -> None:
    """The reference and the run answer every session in order, whole, with a margin per token; each cut attempt
    stopped at the token (or ended before it)."""
    for side, answers in (("reference", run.reference), ("answers", run.answers)):
        c.equal(RESULTS, f"{at}.{side} (every session once, in order)", run.sessions, [x.session_id for x in answers])
        for x in answers:
            if x.error is None and x.session_id in new:
                where = f"{at}.{side}.{x.session_id}"
                whole(c, where, x, lengths[x.session_id], new[x.session_id], eos)
                c.equal(RESULTS, f"{where}: one margin per token", len(x.tokens), len(x.margins or []))
    c.equal(RESULTS, f"{at}.cut (each cancelled session once, in order)", run.cancelled,
            [x.session_id for x in run.cut])  # fmt: skip
    for x in run.cut:
        if x.error is None:
            cut = x.stop == CANCELLED and run.at_token <= len(x.token_ns) <= new.get(x.session_id, 0)
            ended = x.stop != CANCELLED and len(x.token_ns) < run.at_token
            c.equal(RESULTS, f"{at}.cut.{x.session_id}: cut at token {run.at_token} (or ended before it)", True,
                    cut or ended)  # fmt: skip
