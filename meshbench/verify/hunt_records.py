"""verify for a hunt bundle's answers, run by run, as records: each its request's and where it is; each answer
whole (a stamp and a margin per token, never more ids than asked, what the server says it predicted, evaluated and
computed in agreement with the request); each cold answer one record for every alike request across the bundle
(the oracle asks once, so even its stamps are shared); no two runs with the same stamps (a run copied is not a
second run); the calibration passes as the hunt draws them; and how long the records themselves took, the least
any clock could have measured around them."""

from __future__ import annotations

from typing import Any

import numpy as np

from meshbench.analysis.checks import Checks
from meshbench.names import RESULTS
from meshbench.records.history import Facts
from meshbench.workload import hunt as strategies

CALIBRATION = 8  # requests measured cold, cold all at once and warm (meshbench.hunt.oracle.CALIBRATION)
CALIBRATION_TOKENS = 12
Run = dict[str, Any]


def runs(doc: dict[str, Any]) -> list[tuple[str, Run]]:
    """Every run in the bundle, named where it is: the histories checked, then each finding's."""
    out = [(f"checked[{k}]", x) for k, x in enumerate(doc["checked"])]
    for k, f in enumerate(doc["findings"]):
        out += [(f"findings[{k}].confirmations[{j}]", x) for j, x in enumerate(f["confirmations"])]
        out += [(f"findings[{k}].minimal", f["minimal"])]
        out += [(f"findings[{k}].minimal_confirmations[{j}]", x) for j, x in enumerate(f["minimal_confirmations"])]
    return out


def _requests(run: Run) -> list[dict[str, Any]]:
    return [r for s in run["history"]["steps"] for r in s["requests"]]


def check(c: Checks, doc: dict[str, Any]) -> None:
    seen_cold: dict[str, dict[str, Any]] = {}
    stamps: dict[tuple[object, ...], str] = {}
    for at, run in runs(doc):
        reqs = _requests(run)
        c.equal(RESULTS, f"{at}.answers (each request's, by session id, in order)", [r["name"] for r in reqs],
                [a["session_id"] for a in run["answers"]])  # fmt: skip
        judged = [r for r in reqs if r.get("cancel_at") is None]
        c.equal(RESULTS, f"{at}.cold (one for each judged request)", len(judged), len(run["cold"]))
        for r, a in zip(reqs, run["answers"]):
            c.equal(RESULTS, f"{at}.answers.{r['name']} (whole: {_whole(r, a, cold=False) or 'as asked'})", None,
                    _whole(r, a, cold=False))  # fmt: skip
        for r, x in zip(judged, run["cold"]):
            c.equal(RESULTS, f"{at}.cold.{r['name']} (whole, and cold: every prompt id computed)", None,
                    _whole(r, x, cold=True))  # fmt: skip
            key = _key(r)
            earlier = seen_cold.setdefault(key, x)
            c.equal(RESULTS, f"{at}.cold.{r['name']} (the one cold record of every alike request)", earlier, x)
        mine = tuple((a["submit_ns"], tuple(a["token_ns"])) for a in run["answers"])
        first = stamps.setdefault(mine, at)
        c.equal(RESULTS, f"{at}.answers (stamps of its own: a run, not a copy of another)", at, first)


def _key(r: dict[str, Any]) -> str:
    return repr((r["prompt"], r["new_tokens"], r.get("turns", [])))


def _whole(r: dict[str, Any], a: dict[str, Any], cold: bool) -> str | None:
    """What is wrong with an answer as a record of its request (None: nothing); an answer that failed is its
    error alone."""
    if a["error"] is not None:
        return None
    asked = r["new_tokens"] * (1 + len(r.get("turns", [])))
    n = len(a["tokens"])
    if n > asked:
        return f"{n} ids, {asked} asked"
    if len(a["token_ns"]) != n or a["token_ns"] != sorted(a["token_ns"]) or any(t < 0 for t in a["token_ns"]):
        return "a stamp per token, in order"
    evaluated, computed = a["evaluated"], a.get("computed")
    if (cold or r.get("cancel_at") is None) and None in (a["predicted"], evaluated, computed):
        return "predicted, evaluated and computed, each said (the node and llama-server say them)"
    if a["predicted"] is not None and not n <= a["predicted"] <= asked:
        return f"predicted {a['predicted']} for {n} ids, {asked} asked"
    if evaluated is not None and computed is not None and not 0 <= computed <= evaluated:
        return f"computed {computed} of {evaluated} evaluated"
    if evaluated is not None and not r.get("turns") and (cold or r.get("cancel_at") is None):
        if evaluated != len(r["prompt"]):
            return f"evaluated {evaluated} for a prompt of {len(r['prompt'])}"
    if cold and evaluated is not None and computed is not None and computed != evaluated:
        return f"computed {computed} of {evaluated} on a cold answer"
    return None


def calibration(c: Checks, doc: dict[str, Any], facts: Facts) -> None:
    """Each pass: CALIBRATION requests c0, c1, ... of CALIBRATION_TOKENS ids, their prompts the ones the hunt draws
    from its seed (their lengths, where the server says what it evaluated), every one cold but the warm pass's."""
    rng = np.random.default_rng([doc["seed"], 0, 1])
    lengths = [len(strategies.prompt(rng, facts, int(rng.integers(16, 200)))) for _ in range(CALIBRATION)]
    names = [f"c{k}" for k in range(CALIBRATION)]
    for k in ("cold", "together", "warm"):
        got = doc["calibration"][k]
        c.equal(RESULTS, f"calibration.{k} (the requests c0..c{CALIBRATION - 1}, in order)", names,
                [x["session_id"] for x in got])  # fmt: skip
        for name, n, x in zip(names, lengths, got):
            r = {"name": name, "prompt": [0] * n, "new_tokens": CALIBRATION_TOKENS}
            c.equal(RESULTS, f"calibration.{k}.{name} (whole, its prompt as drawn from the seed)", None,
                    _whole(r, x, cold=k != "warm"))  # fmt: skip


def least_seconds(run: Run) -> float:
    """The least time the run can have taken: each step's requests are stamped from when the step was sent, so a
    step took at least its latest stamp, and the steps ran one after another."""
    by = {a["session_id"]: a for a in run["answers"]}
    total = 0
    for s in run["history"]["steps"]:
        total += max((max(by.get(r["name"], {}).get("token_ns") or [0]) for r in s["requests"]), default=0)
    return total / 1e9
