"""verify for a hunt bundle's answers, run by run, as records: each its request's and where it is; each answer
whole (a stamp and a margin per token, never more ids than asked, what the server says it predicted, evaluated and
computed in agreement with the request); each cold answer one record for every alike request across the bundle
(the oracle asks once, so even its stamps are shared); no two runs with the same stamps (a run copied is not a
second run); and the calibration passes as the hunt draws them."""

from __future__ import annotations

from meshbench.analysis.checks import Checks
from meshbench.names import RESULTS
from meshbench.records.completion import Completion
from meshbench.records.history import Request
from meshbench.records.hunt import HuntDocument
from meshbench.workload import hunt as strategies


def check(c: Checks, doc: HuntDocument) -> None:
    seen_cold: dict[tuple[object, ...], Completion] = {}
    stamps: dict[tuple[object, ...], str] = {}
    for at, run in doc.runs():
        reqs = run.history.requests()
        c.equal(RESULTS, f"{at}.answers (each request's, by session id, in order)", [r.name for r in reqs],
                [a.session_id for a in run.answers])  # fmt: skip
        judged = run.judged()
        c.equal(RESULTS, f"{at}.cold (one for each judged request)", len(judged), len(run.cold))
        for r, a in zip(reqs, run.answers):
            c.equal(RESULTS, f"{at}.answers.{r.name} (whole: {_whole(r, a, cold=False) or 'as asked'})", None,
                    _whole(r, a, cold=False))  # fmt: skip
        for r, x in zip(judged, run.cold):
            c.equal(RESULTS, f"{at}.cold.{r.name} (whole, and cold: every prompt id computed)", None,
                    _whole(r, x, cold=True))  # fmt: skip
            earlier = seen_cold.setdefault(r.key(), x)
            c.equal(RESULTS, f"{at}.cold.{r.name} (the one cold record of every alike request)", earlier, x)
        mine = tuple((a.submit_ns, tuple(a.token_ns)) for a in run.answers)
        first = stamps.setdefault(mine, at)
        c.equal(RESULTS, f"{at}.answers (stamps of its own: a run, not a copy of another)", at, first)


def _whole(r: Request, a: Completion, cold: bool) -> str | None:
    """What is wrong with an answer as a record of its request (None: nothing); an answer that failed is its
    error alone."""
    if a.error is not None:
        return None
    asked, n = r.answer_tokens, len(a.tokens)
    if n > asked:
        return f"{n} ids, {asked} asked"
    if len(a.token_ns) != n or a.token_ns != sorted(a.token_ns) or any(t < 0 for t in a.token_ns):
        return "a stamp per token, in order"
    evaluated, computed, judged = a.evaluated, a.computed, cold or r.cancel_at is None
    if judged and None in (a.predicted, evaluated, computed):
        return "predicted, evaluated and computed, each said (the node and llama-server say them)"
    if a.predicted is not None and not n <= a.predicted <= asked:
        return f"predicted {a.predicted} for {n} ids, {asked} asked"
    if evaluated is not None and computed is not None and not 0 <= computed <= evaluated:
        return f"computed {computed} of {evaluated} evaluated"
    if evaluated is not None and not r.turns and judged and evaluated != len(r.prompt):
        return f"evaluated {evaluated} for a prompt of {len(r.prompt)}"
    if cold and evaluated is not None and computed is not None and computed != evaluated:
        return f"computed {computed} of {evaluated} on a cold answer"
    return None


def calibration(c: Checks, doc: HuntDocument) -> None:
    """Each pass: the calibration requests c0, c1, ..., as the hunt draws them from its seed (their prompts'
    lengths, where the server says what it evaluated), every one cold but the warm pass's."""
    asked = strategies.calibration(doc.facts, doc.seed)
    names = [r.name for r in asked]
    cal = doc.calibration
    for k, got in (("cold", cal.cold), ("together", cal.together), ("warm", cal.warm)):
        c.equal(RESULTS, f"calibration.{k} (the requests {names[0]}..{names[-1]}, in order)", names,
                [x.session_id for x in got])  # fmt: skip
        for r, x in zip(asked, got):
            c.equal(RESULTS, f"calibration.{k}.{r.name} (whole, its prompt as drawn from the seed)", None,
                    _whole(r, x, cold=k != "warm"))  # fmt: skip
