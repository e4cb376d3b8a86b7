"""A comparison as Markdown, for a CI job page: the sides, what differs, then a table per verdict."""

from __future__ import annotations

from meshbench.compare.model import Comparison, FigureVerdict, LevelComparison, OutputsVerdict, SchedulerVerdict
from meshbench.compare.sides import FIGURES
from meshbench.results.markdown import median_range


def level_name(lv: LevelComparison) -> str:
    name = str(lv.concurrency) if lv.rate is None else f"{lv.concurrency} @ {lv.rate:g}"
    return name + (f" [{','.join(lv.faults)}]" if lv.faults else "")


def verdict_text(v: FigureVerdict) -> str:
    """'regressed', or 'regressed (weak)' when a side has fewer than five repetitions."""
    if v.verdict == "unchanged":
        return "unchanged"
    return v.verdict if v.strong else f"{v.verdict} (weak)"


def outputs_text(o: OutputsVerdict) -> str:
    if o.first_divergence is not None:
        return f"changed: {o.first_divergence.describe()}"
    if o.verdict == "changed":
        return f"changed ({len(o.sessions_changed)} of {o.sessions_compared} differ: {', '.join(o.sessions_changed)})"
    return o.verdict


def scheduler_text(s: SchedulerVerdict) -> str:
    if not s.changes:
        return s.verdict
    return "changed: " + ", ".join(f"{k} {v.baseline} -> {v.candidate}" for k, v in s.changes.items())


def sides_line(report: Comparison) -> str:
    """What each side is, and how their outputs compare."""
    (a, b), (va, vb) = report.sides, report.versions
    return (
        f"{a} ({va or 'version unknown'}) against {b} ({vb or 'version unknown'}); outputs compared by "
        f"{report.compared_by or 'nothing (token ids on one side, text on the other)'}"
    )


def header(report: Comparison, perf_mode: str) -> list[str]:
    """What was compared with what, and the verdicts in one line each."""
    s = report.summary
    return [
        f"# meshbench compare: `{report.baseline}` -> `{report.candidate}`",
        "",
        f"{sides_line(report)}.",
        "",
        *(f"- {n}" for n in report.notes),
        f"- outputs: {'changed at levels ' + str(s.outputs_changed) if s.outputs_changed else 'same'}",
        f"- scheduler: {'changed at levels ' + str(s.scheduler_changed) if s.scheduler_changed else 'same'}",
        f"- performance ({perf_mode}, tolerance {report.tolerance:.0%}): "
        + (f"regressed: {', '.join(s.regressed)}" if s.regressed else "no strong regression")
        + (f"; improved: {', '.join(s.improved)}" if s.improved else "")
        + (f"; weak verdicts (fewer than 5 repetitions): {', '.join(s.weak)}" if s.weak else ""),
        "",
    ]


def render(report: Comparison, perf_mode: str) -> str:
    lines = header(report, perf_mode)
    if report.differences:
        lines += [
            "## What differs besides the workload"
            + (" (a comparison across machines)" if report.across_machines else ""),
            "",
            "| kind | field | baseline | candidate |",
            "|---|---|---|---|",
            *(f"| {d.kind} | {d.field} | {d.baseline} | {d.candidate} |" for d in report.differences),
            "",
        ]
    lines += ["## Outputs and scheduler", "", "| level | outputs | scheduler |", "|---|---|---|"]
    lines += [
        f"| {level_name(lv)} | {outputs_text(lv.outputs)} | {scheduler_text(lv.scheduler)} |" for lv in report.levels
    ]
    lines += [
        "",
        "## Performance (median (min..max) of the repetitions)",
        "",
        "| level | figure | baseline | candidate | candidate / baseline | verdict |",
        "|---|---|---|---|---|---|",
    ]
    for lv in report.levels:
        for f, _, _ in FIGURES:
            v = lv.performance.get(f)
            if v is not None:
                ratio = "-" if v.ratio is None else f"{v.ratio:.2f}"
                p = "" if v.p_value is None else f", p={v.p_value:.3g}"
                lines.append(
                    f"| {level_name(lv)} | {f} | {median_range(v.baseline, '.4g', sep='..')} | "
                    f"{median_range(v.candidate, '.4g', sep='..')} | {ratio} | {verdict_text(v)} ({v.change:+.1%}{p}) |"
                )
    return "\n".join(lines) + "\n"
