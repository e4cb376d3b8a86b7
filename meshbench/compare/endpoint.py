"""`meshbench compare` where one side, or both, is an endpoint bundle: the same workload served two ways
("llama-server vs meshbench's node, same model, same prompts", or two servers).

Per common concurrency level:
- outputs: each session's output equal or not, by token ids where both sides have them, else by text
  where both have text; a node bundle has ids only, so against an endpoint compared by text there is
  nothing to compare (said so);
- performance: total tokens/s (prompt + generated over the pass's wall time), TTFT p50, ITL p50/p99 and
  E2E p50 per repetition, judged like every compare (``stats.judge``: a change must exceed the tolerance
  and the spread).
Two llama.cpp builds (llama-cpp-python's and llama-server's) may compute differently: figures and each
side's own determinism compare across them; token identity holds only where both compute alike.
"""

from __future__ import annotations

from pathlib import Path

from meshbench.analysis import endpoint as endpoint_figures
from meshbench.analysis import figures, stats
from meshbench.errors import MeshbenchError
from meshbench.records import serial
from meshbench.results import kinds
from meshbench.results.markdown import median_range

# (the endpoint's figure, the node's wall figure, higher is better)
PERF = (
    ("total_tokens_per_s", "tokens_per_s", True),
    ("ttft_ms.p50", "ttft_ms.p50", False),
    ("itl_ms.p50", "itl_ms.p50", False),
    ("itl_ms.p99", "itl_ms.p99", False),
    ("e2e_ms.p50", "e2e_ms.p50", False),
)


QUEUE_SHAPED = ("ttft_ms.p50", "e2e_ms.p50")
NOTE_QUEUE = (
    "TTFT and E2E are left out: a node sweep submits every session at once (time queued counts), the endpoint's "
    "clients are closed-loop; tokens/s and ITL compare."
)
NOTE_VERSIONS = (
    "The two sides run different llama.cpp builds (or engines): their figures and each side's own determinism "
    "compare; token identity between them holds only where both compute alike."
)


def side(data: dict) -> dict:
    """What a bundle of either kind offers a comparison: its name, workload, and per level the outputs and the
    per-repetition samples of each figure (each kind's reduction, ``SIDES``)."""
    return SIDES[kinds.of(data)](data)


def _endpoint_side(data: dict) -> dict:
    """A served endpoint's outputs and figures, as its bundle recorded them."""
    compared = data["verdicts"]["compared"]
    wl = data["workload"]
    levels = {
        lv.concurrency: {
            "outputs": {  # (None: the session failed, and has no output)
                c.session_id: endpoint_figures.output(c, compared) if c.error is None else None
                for c in lv.repetitions[0].sessions
            },
            "samples": {f: [x for r in lv.repetitions if (x := r.figures[f]) is not None] for f, _, _ in PERF},
        }
        for lv in serial.endpoint_levels(data["levels"])
    }
    name = data["endpoint"].get("launched", {}).get("server") or data["endpoint"]["server"]
    version = data["endpoint"].get("launched", {}).get("version") or data["endpoint"].get("build_info")
    return {
        "name": name,
        "version": version,
        "by": compared,
        "sha256": wl["prompts_sha256"],
        "prompt_tokens": wl["prompt_tokens"],
        "new_tokens": wl["new_tokens"],
        "levels": levels,
    }


def _node_side(data: dict) -> dict:
    """A node's outputs and figures, recomputed from its records."""
    levels = {}
    for lv in serial.levels_of(data):
        if lv.rate is not None or lv.faults:
            continue
        per_rep = [
            figures.scalar_figures(figures.wall_figures(r.sessions, r.tick_records, r.wall_s)) for r in lv.repetitions
        ]
        levels[lv.concurrency] = {
            "outputs": {s.session_id: s.tokens if s.done_reason == "COMPLETED" else None for s in lv.sessions},
            "samples": {f: [r[node] for r in per_rep if node in r] for f, node, _ in PERF},
        }
    sha = ((data.get("inputs") or {}).get("workload.prompts") or {}).get("sha256")
    return {
        "name": f"meshbench node ({data['engine']['kind']})",
        "version": f"llama-cpp-python {data['environment'].get('llama_cpp')}",
        "by": "tokens",
        "sha256": sha,
        "prompt_tokens": data["workload"]["prompt_tokens"],
        "new_tokens": data["workload"]["new_tokens"],
        "levels": levels,
    }


SIDES = {kinds.NODE: _node_side, kinds.ENDPOINT: _endpoint_side}  # each kind's reduction (meshbench.results.kinds)


def compare(base_data: dict, cand_data: dict, baseline: Path, candidate: Path, tolerance: float) -> dict:
    b, c = side(base_data), side(cand_data)
    for key, what in (("sha256", "prompts file"), ("prompt_tokens", "prompt lengths"), ("new_tokens", "new tokens")):
        if b[key] != c[key]:
            raise MeshbenchError(
                f"{baseline} and {candidate} ran different workloads (their {what} differ): there is nothing to compare"
            )
    common = sorted(set(b["levels"]) & set(c["levels"]))
    if not common:
        raise MeshbenchError(f"{baseline} and {candidate} share no concurrency level")
    by = b["by"] if b["by"] == c["by"] else None
    # A node sweep submits every session at once (its TTFT and E2E include time queued); an endpoint's clients
    # are closed-loop (a session is sent when a client is free): those two figures compare only like with like.
    mixed = kinds.of(base_data) != kinds.of(cand_data)
    figs = [f for f, _, _ in PERF if not (mixed and f in QUEUE_SHAPED)]
    levels = [
        {
            "concurrency": k,
            "outputs": _outputs(b["levels"][k], c["levels"][k], by),
            "performance": _performance(b["levels"][k], c["levels"][k], tolerance, figs),
        }
        for k in common
    ]
    notes = [NOTE_QUEUE] if mixed else []
    if b["version"] != c["version"]:
        notes.append(NOTE_VERSIONS)
    return {
        "baseline": str(baseline),
        "candidate": str(candidate),
        "sides": [b["name"], c["name"]],
        "versions": [b["version"], c["version"]],
        "compared_by": by,
        "tolerance": tolerance,
        "levels": levels,
        "notes": notes,
    }


def _outputs(b: dict, c: dict, by: str | None) -> dict:
    if by is None:
        return {"verdict": "not compared (token ids on one side, text on the other)", "sessions_changed": []}
    both = sorted(set(b["outputs"]) & set(c["outputs"]))
    # A session that failed on either side has no output to call the same: it counts as changed.
    changed = [
        s for s in both if b["outputs"][s] is None or c["outputs"][s] is None or b["outputs"][s] != c["outputs"][s]
    ]
    return {"verdict": "changed" if changed else "same", "sessions_compared": len(both), "sessions_changed": changed}


def _performance(b: dict, c: dict, tolerance: float, figs: list[str]) -> dict:
    out = {}
    for f, _, higher in PERF:
        xs, ys = b["samples"][f], c["samples"][f]
        if f in figs and xs and ys:
            v = stats.judge(xs, ys, higher, tolerance).to_dict()
            out[f] = {
                **v,
                "baseline": stats.summary(xs),
                "candidate": stats.summary(ys),
                "higher_is_better": higher,
                "ratio": _ratio(stats.summary(ys)["median"], stats.summary(xs)["median"]),
            }
    return out


def _ratio(candidate: float, baseline: float) -> float | None:
    """candidate / baseline, None from a zero baseline (JSON has no infinity; the verdict says +-100%)."""
    return candidate / baseline if baseline else None


def summarize(report: dict) -> dict:
    perf = [(lv["concurrency"], f, v) for lv in report["levels"] for f, v in lv["performance"].items()]
    return {
        "outputs_changed": [lv["concurrency"] for lv in report["levels"] if lv["outputs"]["verdict"] == "changed"],
        "scheduler_changed": [],
        "regressed": [f"{f}@{c}" for c, f, v in perf if v["verdict"] == "regressed" and v["strong"]],
        "improved": [f"{f}@{c}" for c, f, v in perf if v["verdict"] == "improved" and v["strong"]],
        "weak": [f"{f}@{c}" for c, f, v in perf if v["verdict"] != "unchanged" and not v["strong"]],
    }


def render(report: dict) -> str:
    """The comparison as Markdown: one row per level and figure."""
    a, b = report["sides"]
    lines = [
        f"# {a} ({report['baseline']}) vs {b} ({report['candidate']})",
        "",
        f"Outputs compared by {report['compared_by'] or 'nothing (ids on one side, text on the other)'}; "
        f"a change must exceed {report['tolerance']:.0%} and the spread of the repetitions. Versions: "
        f"{report['versions'][0]} vs {report['versions'][1]}.",
        "",
        *(f"- {n}" for n in report["notes"]),
        "",
        "| C | outputs | figure | baseline median (min..max) | candidate median (min..max) | candidate / baseline "
        "| verdict |",
        "|---|---|---|---|---|---|---|",
    ]
    for lv in report["levels"]:
        o = lv["outputs"]
        outs = o["verdict"] + (
            f" ({len(o['sessions_changed'])} of {o['sessions_compared']} differ)" if o["verdict"] == "changed" else ""
        )
        for f, v in lv["performance"].items():
            ratio = "-" if v["ratio"] is None else f"{v['ratio']:.2f}"
            lines.append(
                f"| {lv['concurrency']} | {outs} | {f} | {_s(v['baseline'])} | {_s(v['candidate'])} | "
                f"{ratio} | {v['verdict']}{'' if v['strong'] else ' (weak)'} |"
            )
    return "\n".join(lines) + "\n"


def _s(s: dict) -> str:
    return median_range(s, ".1f", sep="..")
