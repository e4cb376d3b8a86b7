"""The endpoint's canaries, checked from the bundle: each level's run (its sessions, the codes the seed draws,
the prompts that carry them, every answer whole) and the search of every answer recomputed."""

from __future__ import annotations

from typing import Any

from meshbench.analysis import canary as plant
from meshbench.analysis.checks import Checks
from meshbench.engine import apis
from meshbench.names import RESULTS
from meshbench.records.canary import CanaryRun, CanarySearch
from meshbench.results.typed import EndpointBundle
from meshbench.verify.endpoint_proofs import whole


def check_canaries(c: Checks, b: EndpointBundle, ids: list[str]) -> None:
    """Every level's canary run, and the search over every answer recomputed."""
    r = b.results
    codes = plant.canaries(r.workload.seed, [lv.concurrency for lv in r.levels])
    native = apis.recorded(r.endpoint.api).ids
    every = [i for lv in r.levels if lv.canary is not None for i in lv.canary.canary_ids]
    use_ids = native and plant.ids_usable(every)  # (else the search is by text alone, as it was made)
    for i, lv in enumerate(r.levels):
        at = f"levels[{i}].canary"
        c.equal(RESULTS, f"{at} (every level has its canary run)", True, lv.canary is not None)
        if lv.canary is not None:
            _check_run(c, lv.canary, at, ids[: lv.concurrency], codes[lv.concurrency], native, use_ids,
                       dict(zip(ids, r.workload.new_tokens)), r.workload.eos)  # fmt: skip
    later = plant.open_loop_answers(r.rates)
    _check_search(c, plant.search(r.levels, r.margins, r.needle.alone, later), r.canaries)


def _check_search(c: Checks, expected: CanarySearch | None, recorded: CanarySearch | None) -> None:
    """The search recomputed: its counts and verdict, then its hits (their number, and the first that differs,
    so a forged list of a million hits is one short line)."""
    what = "canaries (every answer searched for every code sent before or beside it but its own, recomputed)"
    if expected is None or recorded is None:
        c.equal(RESULTS, what, expected, recorded)
        return
    counts = ("planted", "echoed", "searched", "failed", "leak")
    c.equal(RESULTS, f"{what}: {', '.join(counts)}", [getattr(expected, k) for k in counts],
            [getattr(recorded, k) for k in counts])  # fmt: skip
    c.equal(RESULTS, "canaries.hits (how many)", len(expected.hits), len(recorded.hits))
    first = next((i for i, (a, b) in enumerate(zip(expected.hits, recorded.hits)) if a != b), None)
    if first is not None:
        c.equal(RESULTS, f"canaries.hits[{first}]", expected.hits[first], recorded.hits[first])


def _check_run(
    c: Checks,
    run: CanaryRun,
    at: str,
    sessions: list[str],
    codes: list[str],
    native: bool,
    use_ids: bool,
    new: dict[str, Any],
    eos: str,
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
        c.equal(RESULTS, f"{where}.prompts: the code, then its ids {plant.REPEATS - 1} times more", True,
                _carries(prompt, code_ids))  # fmt: skip
        if x.error is None and s in new:
            whole(c, where, x, len(prompt), new[s], eos)
    c.equal(RESULTS, f"{at}.echoed (recomputed)",
            plant.echoed(run.sessions, run.canaries, run.canary_ids, run.answers, use_ids), run.echoed)  # fmt: skip


def _carries(prompt: list[int], code_ids: list[int]) -> bool:
    """Is ``prompt`` the code (BOS and its first ids, at most two more than the code's own) followed by its ids
    once for each repeat after the first, and nothing else? (Where the tokenizer gave the code no ids of its
    own, a prompt of one id per repeat at least: the search is then by text alone.)"""
    if not code_ids:
        return len(prompt) >= plant.REPEATS
    tail = code_ids * (plant.REPEATS - 1)
    head = len(prompt) - len(tail)
    return 1 <= head <= len(code_ids) + 2 and prompt[head:] == tail
