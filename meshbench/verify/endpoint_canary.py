"""The endpoint's canaries, checked from the bundle: each level's run (its sessions, the codes the seed draws,
the prompts that carry them, every answer whole) and the search of every answer recomputed."""

from __future__ import annotations

from meshbench.analysis import canary as plant
from meshbench.analysis.checks import Checks
from meshbench.names import RESULTS
from meshbench.records.canary import CanaryRun
from meshbench.results.typed import EndpointBundle
from meshbench.verify.endpoint_proofs import whole


def check_canaries(c: Checks, b: EndpointBundle, ids: list[str]) -> None:
    """Every level's canary run, and the search over every answer recomputed."""
    r = b.results
    codes = plant.canaries(r.workload.seed, [lv.concurrency for lv in r.levels])
    native = r.endpoint.api == "native"
    for i, lv in enumerate(r.levels):
        at = f"levels[{i}].canary"
        c.equal(RESULTS, f"{at} (every level has its canary run)", True, lv.canary is not None)
        if lv.canary is not None:
            _check_run(c, lv.canary, at, ids[: lv.concurrency], codes[lv.concurrency], native,
                       dict(zip(ids, r.workload.new_tokens)), r.workload.eos)  # fmt: skip
    c.equal(RESULTS, "canaries (every answer searched for every code but its own, recomputed)",
            plant.search(r.levels, r.margins, r.needle.alone), r.canaries)  # fmt: skip


def _check_run(
    c: Checks, run: CanaryRun, at: str, sessions: list[str], codes: list[str], native: bool, new: dict, eos: str
) -> None:
    c.equal(RESULTS, f"{at}.sessions (the first C)", sessions, run.sessions)
    c.equal(RESULTS, f"{at}.canaries (drawn from the workload's seed)", codes, run.canaries)
    n = len(sessions)
    c.equal(RESULTS, f"{at}: one code's ids, one prompt and one answer per session", [n, n, n],
            [len(run.canary_ids), len(run.prompts), len(run.answers)])  # fmt: skip
    c.equal(RESULTS, f"{at}.answers (in session order)", run.sessions, [x.session_id for x in run.answers])
    for s, code_ids, prompt, x in zip(run.sessions, run.canary_ids, run.prompts, run.answers):
        where = f"{at}.{s}"
        if not native:  # (a text API sends the text, which is the code repeated: nothing else to hold it to)
            c.equal(RESULTS, f"{where}: no ids over a text API", [[], []], [code_ids, prompt])
            continue
        c.equal(RESULTS, f"{where}.prompts: the code's ids repeated", True, _carries(prompt, code_ids))
        if x.error is None and s in new:
            whole(c, where, x, len(prompt), new[s], eos)
    c.equal(RESULTS, f"{at}.echoed (recomputed)",
            plant.echoed(run.sessions, run.canaries, run.canary_ids, run.answers), run.echoed)  # fmt: skip


def _carries(prompt: list[int], code_ids: list[int]) -> bool:
    """Does ``prompt`` hold ``code_ids`` once for each repeat after the first (each follows a space)? Where the
    code's ids are not known ([]), a prompt of at least one id per repeat."""
    if not code_ids:
        return len(prompt) >= plant.REPEATS
    n, found, i = len(code_ids), 0, 0
    while i + n <= len(prompt):
        if prompt[i : i + n] == code_ids:
            found, i = found + 1, i + n
        else:
            i += 1
    return found >= plant.REPEATS - 1
