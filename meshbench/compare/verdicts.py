"""The three verdicts of one level compared between two sides.

- outputs: between two meshbench nodes, every session's tokens (digests recomputed) equal, or the exact first
  divergence with both margins; otherwise each session's output (token ids where both sides have them, else
  text) equal or not, a failed session counting as changed;
- scheduler: between two nodes on the tick clock, the deterministic figures recomputed from the tick records,
  field by field (an endpoint's schedule is its server's, not on record);
- performance: per figure both sides report, improved / unchanged / regressed by ``stats.judge`` over the
  repetitions of both sides (a change must exceed the tolerance AND the spread).
"""

from __future__ import annotations

import dataclasses

from meshbench.analysis import figures, stats
from meshbench.compare.model import Change, Divergence, FigureVerdict, OutputsVerdict, SchedulerVerdict
from meshbench.compare.sides import FIGURES, Side, SideLevel
from meshbench.records.model import LevelRecord

SCHEDULER_FIELDS = (*figures.TICK_FIGURES, "rejected_admissions", "cache_misses", "failed")


def outputs(b: Side, bl: SideLevel, c: Side, cl: SideLevel) -> OutputsVerdict:
    if bl.record is not None and cl.record is not None:
        # On the wall clock admission depends on speed: only the sessions both sides completed compare.
        return records_verdict(bl.record, cl.record, common_only=b.wall or c.wall)
    if b.by != c.by:
        return OutputsVerdict(
            verdict="not compared (token ids on one side, text on the other)",
            sessions_compared=0,
            sessions_changed=[],
            first_divergence=None,
        )
    both = sorted(set(bl.outputs) & set(cl.outputs))
    # A session that failed on either side has no output to call the same: it counts as changed.
    changed = [s for s in both if bl.outputs[s] is None or cl.outputs[s] is None or bl.outputs[s] != cl.outputs[s]]
    return OutputsVerdict(
        verdict="changed" if changed else "same",
        sessions_compared=len(both),
        sessions_changed=changed,
        first_divergence=None,
    )


def records_verdict(base: LevelRecord, cand: LevelRecord, common_only: bool = False) -> OutputsVerdict:
    """Tokens equal session by session (digests recomputed from the tokens), or the first divergence."""
    b = {s.session_id: s for s in base.sessions}
    c = {s.session_id: s for s in cand.sessions}
    if common_only:
        b = {k: v for k, v in b.items() if k in c and v.done_reason == c[k].done_reason == "COMPLETED"}
        c = {k: v for k, v in c.items() if k in b}
        base = dataclasses.replace(base, sessions=list(b.values()))
        cand = dataclasses.replace(cand, sessions=list(c.values()))
    changed = sorted(
        sid
        for sid in set(b) | set(c)
        if sid not in b or sid not in c or figures.token_digest(b[sid].tokens) != figures.token_digest(c[sid].tokens)
    )
    compared = len(set(b) | set(c))
    if not changed:
        return OutputsVerdict(verdict="same", sessions_compared=compared, sessions_changed=[], first_divergence=None)
    div = figures.first_divergence(base, cand)
    if div is not None:
        s, i = c[div.session_id], div.token_index
        found = Divergence(
            session_id=div.session_id,
            token_index=i,
            reference_token=div.reference_token,
            token=div.token,
            reference_margin=div.reference_margin,
            margin=s.margins[i] if i < len(s.margins) else None,
        )
    else:  # equal where both have tokens: one side stopped earlier, or a session is missing
        sid = changed[0]
        found = Divergence(
            session_id=sid,
            reference_tokens=len(b[sid].tokens) if sid in b else None,
            tokens=len(c[sid].tokens) if sid in c else None,
        )
    return OutputsVerdict(
        verdict="changed", sessions_compared=compared, sessions_changed=changed, first_divergence=found
    )


def scheduler(b: Side, bl: SideLevel, c: Side, cl: SideLevel) -> SchedulerVerdict:
    """The deterministic figures recomputed from the tick and session records of both sides."""
    if bl.record is None or cl.record is None:
        return SchedulerVerdict(verdict="not compared (a server's schedule is not on record)", changes={})
    if b.wall or c.wall:
        return SchedulerVerdict(verdict="not compared (wall clock)", changes={})
    return scheduler_verdict(b.sessions, bl.record, c.sessions, cl.record)


def scheduler_verdict(b_sessions: int, base: LevelRecord, c_sessions: int, cand: LevelRecord) -> SchedulerVerdict:
    b, c = _scheduler_figures(b_sessions, base), _scheduler_figures(c_sessions, cand)
    changes = {k: Change(baseline=b[k], candidate=c[k]) for k in SCHEDULER_FIELDS if b[k] != c[k]}
    return SchedulerVerdict(verdict="changed" if changes else "same", changes=changes)


def _scheduler_figures(sessions: int, level: LevelRecord) -> dict[str, object]:
    served = level.sessions
    return {
        **figures.summarize_ticks(level.tick_records),
        "rejected_admissions": sessions - len(served),
        "cache_misses": sum(s.done_reason == "CACHE_MISS" for s in served),
        "failed": sum(s.done_reason == "FAILED" for s in served),
    }


def compared_figures(b: Side, c: Side) -> list[str]:
    """The figures both sides report; those counting time queued only where both submitted sessions alike."""
    alike = b.submission == c.submission
    return [f for f, _, queued in FIGURES if (alike or not queued)]


def performance(bl: SideLevel, cl: SideLevel, tolerance: float, names: list[str]) -> dict[str, FigureVerdict]:
    out = {}
    for figure, higher, _ in FIGURES:
        xs, ys = bl.samples.get(figure) or [], cl.samples.get(figure) or []
        if figure not in names or not xs or not ys:
            continue
        v = stats.judge(xs, ys, higher, tolerance)
        base, cand = stats.summary(xs), stats.summary(ys)
        out[figure] = FigureVerdict(
            verdict=v.verdict,
            strong=v.strong,
            change=v.change,
            p_value=v.p_value,
            reason=v.reason,
            baseline=base,
            candidate=cand,
            higher_is_better=higher,
            ratio=cand.median / base.median if base.median else None,  # (JSON has no infinity)
        )
    return out
