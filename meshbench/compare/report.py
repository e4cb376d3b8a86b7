"""A comparison as Markdown, for a CI job page: what differs, then a table per verdict."""

from __future__ import annotations

from meshbench.compare.diff import PERF_FIGURES


def level_name(lv: dict) -> str:
    name = str(lv["concurrency"]) if lv["rate"] is None else f"{lv['concurrency']} @ {lv['rate']:g}"
    return name + (f" [{','.join(lv['faults'])}]" if lv.get("faults") else "")


def verdict_text(v: dict) -> str:
    """'regressed', or 'regressed (weak)' when a side has fewer than five repetitions."""
    if v["verdict"] == "unchanged":
        return "unchanged"
    return v["verdict"] if v["strong"] else f"{v['verdict']} (weak)"


def perf_cell(v: dict) -> str:
    p = "" if v["p_value"] is None else f", p={v['p_value']:.3g}"
    return f"{verdict_text(v)}: {v['baseline']['median']:.4g} -> {v['candidate']['median']:.4g} ({v['change']:+.1%}{p})"


def render(report: dict, perf_mode: str) -> str:
    s = report["summary"]
    lines = [
        f"# meshbench compare: `{report['baseline']}` -> `{report['candidate']}`",
        "",
        f"- outputs: {'changed at levels ' + str(s['outputs_changed']) if s['outputs_changed'] else 'same'}",
        f"- scheduler: {'changed at levels ' + str(s['scheduler_changed']) if s['scheduler_changed'] else 'same'}",
        f"- performance ({perf_mode}, tolerance {report['tolerance']:.0%}): "
        + (f"regressed: {', '.join(s['regressed'])}" if s["regressed"] else "no strong regression")
        + (f"; improved: {', '.join(s['improved'])}" if s["improved"] else "")
        + (f"; weak verdicts (fewer than 5 repetitions): {', '.join(s['weak'])}" if s["weak"] else ""),
        "",
    ]
    if report["differences"]:
        lines += [
            "## What differs besides the workload"
            + (" (a comparison across machines)" if report["across_machines"] else ""),
            "",
            "| kind | field | baseline | candidate |",
            "|---|---|---|---|",
        ]
        lines += [f"| {d['kind']} | {d['field']} | {d['baseline']} | {d['candidate']} |" for d in report["differences"]]
        lines.append("")
    lines += ["## Outputs and scheduler", "", "| level | outputs | scheduler |", "|---|---|---|"]
    for lv in report["levels"]:
        out, sch = lv["outputs"], lv["scheduler"]
        div = out["first_divergence"]
        out_text = "same" if div is None else f"changed: {div}"
        sch_text = (
            "same"
            if not sch["changes"]
            else "changed: " + ", ".join(f"{k} {v['baseline']} -> {v['candidate']}" for k, v in sch["changes"].items())
        )
        lines.append(f"| {level_name(lv)} | {out_text} | {sch_text} |")
    names = [f for f, _ in PERF_FIGURES]
    lines += [
        "",
        "## Performance (median of the repetitions, baseline -> candidate)",
        "",
        "| level | " + " | ".join(names) + " |",
        "|---|" + "---|" * len(names),
    ]
    for lv in report["levels"]:
        cells = [perf_cell(lv["performance"][f]) if f in lv["performance"] else "-" for f in names]
        lines.append(f"| {level_name(lv)} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
