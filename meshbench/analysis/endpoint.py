"""An endpoint sweep's figures and verdicts, from its recorded completions alone (the sweep and verify both
compute them here).

The figures come from the client's stamps: TTFT (first token - submit), ITL (between a session's
consecutive tokens, or chunks on the OpenAI API), TPOT ((last - first) / (tokens - 1)), E2E (last token -
submit), tokens/s (generated, and prompt + generated, over the wall time of the pass), goodput (sessions
within both SLOs, per second).

A verdict passes only on outputs that exist: a failed session (an HTTP error, a malformed or cut answer,
the deadline) fails every verdict of its level, and is counted.

Three verdicts, each saying what it cannot conclude (CONCLUSIONS):
- batch invariance: every session's output at each level equals the lowest level's (repetition 0);
- run-to-run determinism: one distinct output per session over the repetitions of a level;
  (in conversations, every turn is judged so, by its name: ``s0#t2`` is session s0's second turn)
- the needle: one fixed prompt among different neighbours at each level, its distinct outputs and how
  many differ from the needle alone.
"""

from __future__ import annotations

from typing import Sequence

from meshbench.analysis import latency, stats
from meshbench.analysis.conversation import label
from meshbench.engine import apis
from meshbench.records import endpoint_figures
from meshbench.records.context import Slo
from meshbench.records.documents import EndpointVerdicts, NeedleVerdict
from meshbench.records.endpoint_figures import LevelFigures, PassFigures, Spread
from meshbench.records.model import Completion, EndpointLevel, EndpointRepetition, NeedleTrial

CONCLUSIONS = {
    "batch_invariant": "True: every session's output was the same at every level, in these runs. False: a "
    "session's output changed with the load. Over HTTP the server's schedule is not ours to see or fix, so a "
    "change cannot be told apart as batch-variant numerics (batch shapes change the arithmetic) or as "
    "sessions leaking into each other: the bundle does not guess.",
    "run_to_run_deterministic": "True: at each level every session gave one output over the repetitions. "
    "False: the same load gave different outputs from run to run (the server's batching varied, or its "
    "kernels are not deterministic).",
    "needle": "The same prompt among different neighbours: more than one distinct output, or an output "
    "other than the needle's alone, means its output depends on what runs beside it.",
    "failed": "A session that failed (an HTTP error, a malformed or cut answer, the deadline) has no output to "
    "compare: every verdict of a run with failed sessions is False, and the failures are counted per level.",
}
FIGURES = tuple(f.name for f in endpoint_figures.FIGURES)  # (by name, as results.json keys them)


def output(c: Completion, compared: str) -> list[int] | str:
    """What is compared of a completion: its token ids, or its text."""
    return c.tokens if compared == "tokens" else c.text


def compared_by(api: str, completions: Sequence[Completion]) -> str:
    """Token ids where the API returns them and every answer's ids are whole (as many as the server says it
    generated); else text (a streamed answer can hold back an incomplete UTF-8 token's id)."""
    if not apis.recorded(api).ids:
        return "text"
    # (a failed answer has no output either way: it never switches the comparison)
    whole = all(c.predicted is None or c.predicted == len(c.tokens) for c in completions if c.error is None)
    return "tokens" if whole else "text"


def pass_figures(
    sessions: Sequence[Completion],
    wall_s: float,
    prompt_lengths: dict[str, int],
    slo: Slo,
    new_tokens: dict[str, int],
) -> PassFigures:
    """One pass's figures from its completions' stamps (ms; tokens per second of the pass's wall time): every
    answer, a conversation's later turns too (``prompt_lengths`` and ``new_tokens`` by the turn's name)."""
    answered = [c for c in sessions if c.error is None]
    ok = [c for c in answered if c.token_ns]  # (an answer of no tokens has no latencies)
    lat = latency.samples(ok)
    p = latency.percentile
    generated = sum(_generated(c) for c in ok)
    prompt = sum(prompt_lengths[label(c)] for c in ok)
    good = sum(latency.within_slo(c.token_ns, c.submit_ns, slo) for c in ok)
    return PassFigures(
        tokens_per_s=generated / wall_s if wall_s > 0 else 0.0,
        total_tokens_per_s=(generated + prompt) / wall_s if wall_s > 0 else 0.0,
        ttft_ms_p50=p(lat.ttft, 50),
        ttft_ms_p99=p(lat.ttft, 99),
        itl_ms_p50=p(lat.itl, 50),
        itl_ms_p99=p(lat.itl, 99),
        tpot_ms_p50=p(lat.tpot, 50),
        e2e_ms_p50=p(lat.e2e, 50),
        e2e_ms_p99=p(lat.e2e, 99),
        goodput_per_s=good / wall_s if wall_s > 0 else 0.0,
        completed=len(answered),
        failed=sum(c.error is not None for c in sessions),
        early_stops=sum(c.error is None and _generated(c) < new_tokens[label(c)] for c in sessions),
    )


def _generated(c: Completion) -> int:
    """Tokens the session received: its stamps (one per token id, or per streamed piece on the OpenAI API),
    never the server's own claim."""
    return len(c.token_ns)


def summary(per_pass: Sequence[PassFigures]) -> LevelFigures:
    """Each figure over the repetitions: median, min and max (None where no pass had it)."""
    out: dict[str, Spread | None] = {}
    for f in endpoint_figures.FIGURES:
        xs = [x for p in per_pass if (x := getattr(p, f.attr)) is not None]
        s = stats.summary(xs) if xs else None
        out[f.attr] = Spread(median=s.median, min=s.min, max=s.max) if s is not None else None
    return LevelFigures(**out)


def verdicts(levels: Sequence[EndpointLevel], needle_alone: Completion | None, compared: str) -> EndpointVerdicts:
    """The three verdicts from the recorded outputs."""
    ref = min(levels, key=lambda lv: lv.concurrency)
    reference = {label(c): output(c, compared) for c in pass_answers(ref.repetitions[0]) if c.error is None}
    differing: dict[int, list[str]] = {}
    distinct: dict[int, dict[str, int]] = {}
    needles: dict[int, NeedleVerdict] = {}
    failed: dict[int, int] = {}
    for lv in levels:
        c_ = lv.concurrency
        answers = [c for rep in lv.repetitions for c in pass_answers(rep)] + [t.completion for t in lv.needle]
        failed[c_] = sum(c.error is not None for c in answers)
        first = {label(c): output(c, compared) for c in pass_answers(lv.repetitions[0]) if c.error is None}
        differing[c_] = sorted(s for s, out in first.items() if s in reference and out != reference[s])
        seen: dict[str, set[str | tuple[int, ...]]] = {}
        for rep in lv.repetitions:
            for c in pass_answers(rep):
                if c.error is None:
                    seen.setdefault(label(c), set()).add(_key(output(c, compared)))
        distinct[c_] = {s: len(v) for s, v in sorted(seen.items())}
        needles[c_] = _needle(lv.needle, needle_alone, compared)
    whole = not any(failed.values()) and (needle_alone is None or needle_alone.error is None)
    return EndpointVerdicts(
        compared=compared,
        reference_concurrency=ref.concurrency,
        failed=failed,
        batch_invariant=whole and all(not d for d in differing.values()),
        differing_sessions=differing,
        run_to_run_deterministic=whole and all(n == 1 for d in distinct.values() for n in d.values()),
        distinct_outputs=distinct,
        needle=needles,
        needle_stable=whole and all(n.distinct <= 1 and n.differs_from_alone == 0 for n in needles.values()),
    )


def pass_answers(rep: EndpointRepetition) -> list[Completion]:
    """A pass's answers: its sessions' first turns, then a conversation's later turns."""
    return [*rep.sessions, *(rep.turns or ())]


def differing_from_reference(
    levels: Sequence[EndpointLevel], answers: Sequence[Completion], compared: str
) -> list[str]:
    """The sessions among ``answers`` with an output other than the reference's (the lowest level's first
    repetition): for answers given outside the levels, as the open-loop passes'."""
    ref = min(levels, key=lambda lv: lv.concurrency)
    reference = {c.session_id: output(c, compared) for c in ref.repetitions[0].sessions if c.error is None}
    return sorted(
        {
            c.session_id
            for c in answers
            if c.error is None and c.session_id in reference and output(c, compared) != reference[c.session_id]
        }
    )


def _key(x: list[int] | str) -> str | tuple[int, ...]:
    return tuple(x) if isinstance(x, list) else x


def _needle(trials: Sequence[NeedleTrial], alone: Completion | None, compared: str) -> NeedleVerdict:
    outs = [output(t.completion, compared) for t in trials if t.completion.error is None]
    base = None if alone is None or alone.error is not None else output(alone, compared)
    return NeedleVerdict(
        trials=len(trials),
        distinct=len({_key(o) for o in outs}),
        differs_from_alone=sum(o != base for o in outs) if base is not None else None,
    )
