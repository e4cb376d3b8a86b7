"""The README of an endpoint bundle, rendered from its results.json alone (verify renders it again and
compares)."""

from __future__ import annotations

from meshbench.names import RESULTS
from meshbench.results import markdown
from meshbench.results.markdown import median_range

TABLE_HEADER = (
    "| C | differ from C=ref | max distinct per session | needle distinct / differ from alone | "
    "tok/s | total tok/s | TTFT p50 ms | TTFT p99 ms | ITL p50 ms | ITL p99 ms | E2E p50 ms | "
    "failed | early stops |"
)


def cell(spread: dict | None, digits: int = 1) -> str:
    """A figure over the repetitions: the median, and min..max when they differ."""
    return median_range(spread, f".{digits}f", sep="..", drop_equal=True)


def _launched(e: dict) -> list[str]:
    """The server meshbench started for the sweep, as it started it."""
    if "launched" not in e:
        return []
    x = e["launched"]
    flags = " ".join(x["args"]) if x["args"] else "none: its defaults"
    return [
        f"meshbench started {x['server']} (version {x['version']}) on {x['model']}, on a free loopback port; "
        f"its flags: {flags}."
    ]


def _dash(x) -> str:
    return "-" if x is None else str(x)


def table_rows(data: dict) -> list[list[str]]:
    v = data["verdicts"]
    rows = []
    for lv in data["levels"]:
        c, f = str(lv["concurrency"]), lv["figures"]
        needle = v["needle"][c]
        rows.append(
            [
                c,
                str(len(v["differing_sessions"][c])),
                str(max(v["distinct_outputs"][c].values(), default=0)),
                f"{needle['distinct']} / {_dash(needle['differs_from_alone'])}",
                cell(f["tokens_per_s"]),
                cell(f["total_tokens_per_s"]),
                cell(f["ttft_ms.p50"]),
                cell(f["ttft_ms.p99"]),
                cell(f["itl_ms.p50"], 2),
                cell(f["itl_ms.p99"], 2),
                cell(f["e2e_ms.p50"]),
                cell(f["failed"], 0),
                cell(f["early_stops"], 0),
            ]
        )
    return rows


def render_readme(data: dict, name: str) -> str:
    e, wl, v = data["endpoint"], data["workload"], data["verdicts"]
    reps = len(data["levels"][0]["repetitions"])
    lines = [
        f"# {markdown.inline(data['story'])}: {markdown.inline(data['title'])}",
        "",
        f"A serving endpoint as the node under test: {e['server']} at {e['url']} ({e['api']} API"
        + (f", build {e['build_info']}" if e.get("build_info") else "")
        + f"), serving {', '.join(map(str, e['models']))}."
        + ("" if e["loopback"] else f" The endpoint is not on this machine: host {e['url']}."),
        *_launched(e),
        f"{wl['sessions']} sessions from `{wl['prompts']}` (sha256 {wl['prompts_sha256'][:12]}), tokenized by the "
        f"server ({min(wl['prompt_tokens'])}-{max(wl['prompt_tokens'])} tokens), {min(wl['new_tokens'])}-"
        f"{max(wl['new_tokens'])} new tokens each, greedy, eos {wl['eos']}; at each level C, C closed-loop clients; "
        f"{reps} repetition(s), the level order rotated each time. Made by `{data['command']}`.",
        "",
        "```",
        f"meshbench verify {name}",
        "```",
        "",
        "## Verdicts",
        "",
        f"Outputs compared: {v['compared']}; the reference is concurrency {v['reference_concurrency']}, repetition 0.",
        "",
        f"- **batch_invariant: {v['batch_invariant']}**. {data['conclusions']['batch_invariant']}",
        f"- **run_to_run_deterministic: {v['run_to_run_deterministic']}**. "
        f"{data['conclusions']['run_to_run_deterministic']}",
        f"- **needle_stable: {v['needle_stable']}** (the needle is {data['needle']['prompt_of']}'s prompt). "
        f"{data['conclusions']['needle']}",
        "",
        "## Per level",
        "",
        f"Medians over {reps} repetition(s), with min..max where they differ; latencies from the client's stamps "
        "as each chunk arrived.",
        "",
        TABLE_HEADER,
        "|" + "---|" * 13,
        *("| " + " | ".join(r) + " |" for r in table_rows(data)),
        "",
        *_metrics(data),
        f"Everything here is computed from `{RESULTS}` by `meshbench verify`; a rerun needs the server.",
        "",
    ]
    return "\n".join(lines)


def _metrics(data: dict) -> list[str]:
    """The server's own metrics around each level's first pass, where it exposes them."""
    rows = []
    for lv in data["levels"]:
        rep = lv["repetitions"][0]
        before, after = rep["metrics_before"] or {}, rep["metrics_after"] or {}
        for k in sorted(set(before) | set(after)):
            rows.append(f"| {lv['concurrency']} | `{k}` | {before.get(k, '-')} | {after.get(k, '-')} |")
    if not rows:
        return ["The server exposes no metrics (`/metrics`).", ""]
    return [
        "## Server metrics",
        "",
        "Around each level's first pass (`/metrics`).",
        "",
        "| C | metric | before | after |",
        "|---|---|---|---|",
        *rows,
        "",
    ]


def render_commands(data: dict, name: str) -> str:
    return f"# made by\n{data['command']}\n# verify\nmeshbench verify {name}\n"
