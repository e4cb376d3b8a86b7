"""`meshbench compare BASELINE CANDIDATE`: three verdicts per level, every figure from the raw records.

- outputs: every session's tokens (digests recomputed) equal, or the first divergence;
- scheduler: the deterministic figures recomputed from the tick records, field by field;
- performance: per wall figure, improved / unchanged / regressed by ``stats.judge`` over the
  repetitions of both sides (a change must exceed the tolerance AND the spread).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from meshbench.analysis import figures, stats
from meshbench.compare import endpoint
from meshbench.errors import MeshbenchError
from meshbench.records import serial
from meshbench.records.model import LevelRecord
from meshbench.results import kinds
from meshbench.verify import bundle as verify

# (figure, higher is better): the figures a release gate reads.
PERF_FIGURES = (
    ("decode_tokens_per_s", True),
    ("prefill_tokens_per_s", True),
    ("ttft_ms.p50", False),
    ("ttft_ms.p99", False),
    ("itl_ms.p50", False),
    ("itl_ms.p99", False),
    ("tpot_ms.p50", False),
    ("tpot_ms.p99", False),
)
SCHEDULER_FIELDS = (*figures.TICK_FIGURES, "rejected_admissions", "cache_misses", "failed")
ENGINE_KEYS = (
    "kind",
    "model_sha256",
    "recipe_fingerprint",
    "device",
    "dtype",
    "threads",
    "flash_attn",
    "kv_unified",
    "kv_bytes_per_token",
    "weight_bytes",
)
MACHINE_KEYS = ("cpu", "cpu_count", "platform", "machine")
SOFTWARE_KEYS = ("python", "numpy", "llama_cpp", "git_commit", "git_dirty")


def verified(path: Path, role: str) -> dict:
    """A bundle that passes verify, or a MeshbenchError that says why not."""
    try:
        data, checks = verify.checked_bundle(path)
    except MeshbenchError as e:
        raise MeshbenchError(f"{role}: {e}") from None
    if checks.failures:
        raise MeshbenchError(
            f"{role} {path} does not pass verify ({len(checks.failures)} failed checks, the first: "
            f"{checks.failures[0]}); run meshbench verify {path}"
        )
    return data


def compare(baseline: Path, candidate: Path, tolerance: float) -> dict:
    base, cand = verified(baseline, "baseline"), verified(candidate, "candidate")
    if kinds.ENDPOINT in (kinds.of(base), kinds.of(cand)):  # a served model on one side or both
        report = endpoint.compare(base, cand, baseline, candidate, tolerance)
        return {**report, "summary": endpoint.summarize(report)}
    if base["workload"] != cand["workload"]:
        fields = sorted(
            k
            for k in set(base["workload"]) | set(cand["workload"])
            if base["workload"].get(k) != cand["workload"].get(k)
        )
        named = ", ".join(f"workload.{k}" for k in fields)
        raise MeshbenchError(
            f"{baseline} and {candidate} ran different workloads ({named} differ: {_workload(base)} "
            f"against {_workload(cand)}): there is nothing to compare"
        )
    b_levels = {_level_key(lv): lv for lv in serial.levels_of(base)}
    c_levels = {_level_key(lv): lv for lv in serial.levels_of(cand)}
    common = sorted(set(b_levels) & set(c_levels), key=lambda k: (k[2], k[1] or 0.0, k[0]))
    if not common:
        raise MeshbenchError(f"{baseline} and {candidate} share no level (concurrency and arrival rate)")
    # On the wall clock admission depends on speed: the scheduler figures are not compared, and the
    # outputs only for the sessions both sides completed.
    wall = "wall" in (base["config"]["clock"], cand["config"]["clock"])
    levels = [
        {
            "concurrency": c[0],
            "rate": c[1],
            "faults": list(c[2]),
            "outputs": outputs_verdict(b_levels[c], c_levels[c], common_only=wall),
            "scheduler": (
                {"verdict": "not compared (wall clock)", "changes": {}}
                if wall
                else scheduler_verdict(base, b_levels[c], cand, c_levels[c])
            ),
            "performance": performance_verdicts(b_levels[c], c_levels[c], tolerance),
        }
        for c in common
    ]
    return {
        "baseline": str(baseline),
        "candidate": str(candidate),
        "tolerance": tolerance,
        "differences": differences(base, cand),
        "across_machines": _machine(base) != _machine(cand),
        "levels": levels,
        "summary": summarize(levels),
    }


def _level_key(lv: LevelRecord) -> tuple[int, float | None, tuple[str, ...]]:
    """A level is its concurrency, its arrival rate and its fault row: a sweep of fault rows has one level per
    row at each concurrency, and every row is compared."""
    return lv.concurrency, lv.rate, tuple(lv.faults)


def outputs_verdict(base: LevelRecord, cand: LevelRecord, common_only: bool = False) -> dict:
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
    if not changed:
        return {"verdict": "same", "sessions_changed": [], "first_divergence": None}
    div = figures.first_divergence(base, cand)
    if div is not None:
        s = c[div["session_id"]]
        i = div["token_index"]
        div = dict(div, margin=s.margins[i] if i < len(s.margins) else None)
    else:  # equal where both have tokens: one side stopped earlier, or a session is missing
        sid = changed[0]
        div = {
            "session_id": sid,
            "reference_tokens": len(b[sid].tokens) if sid in b else None,
            "tokens": len(c[sid].tokens) if sid in c else None,
        }
    return {"verdict": "changed", "sessions_changed": changed, "first_divergence": div}


def _scheduler_figures(data: dict, level: LevelRecord) -> dict:
    sessions = level.sessions
    return {
        **figures.summarize_ticks(level.tick_records),
        "rejected_admissions": data["workload"]["sessions"] - len(sessions),
        "cache_misses": sum(s.done_reason == "CACHE_MISS" for s in sessions),
        "failed": sum(s.done_reason == "FAILED" for s in sessions),
    }


def scheduler_verdict(base_data: dict, base: LevelRecord, cand_data: dict, cand: LevelRecord) -> dict:
    """The deterministic figures recomputed from the tick and session records of both sides."""
    b, c = _scheduler_figures(base_data, base), _scheduler_figures(cand_data, cand)
    changes = {k: {"baseline": b[k], "candidate": c[k]} for k in SCHEDULER_FIELDS if b[k] != c[k]}
    return {"verdict": "changed" if changes else "same", "changes": changes}


def samples(level: LevelRecord, figure: str) -> list[float]:
    """``figure`` in every repetition, recomputed from that repetition's raw stamps."""
    out = []
    for rep in level.repetitions:
        values = figures.scalar_figures(figures.wall_figures(rep.sessions, rep.tick_records, rep.wall_s))
        if figure in values:
            out.append(values[figure])
    return out


def performance_verdicts(base: LevelRecord, cand: LevelRecord, tolerance: float) -> dict:
    out = {}
    for figure, higher in PERF_FIGURES:
        b, c = samples(base, figure), samples(cand, figure)
        if not b or not c:
            continue
        v = stats.judge(b, c, higher, tolerance).to_dict()
        out[figure] = {**v, "baseline": stats.summary(b), "candidate": stats.summary(c), "higher_is_better": higher}
    return out


def _key(lv: dict):
    """A level in the summary: its concurrency, with its arrival rate or its fault row when it has one."""
    if lv.get("faults"):
        return f"{lv['concurrency']}[{','.join(lv['faults'])}]"
    return lv["concurrency"] if lv["rate"] is None else f"{lv['concurrency']}@{lv['rate']:g}"


def summarize(levels: list[dict]) -> dict:
    perf = [(_key(lv), f, v) for lv in levels for f, v in lv["performance"].items()]
    return {
        "outputs_changed": [_key(lv) for lv in levels if lv["outputs"]["verdict"] == "changed"],
        "scheduler_changed": [_key(lv) for lv in levels if lv["scheduler"]["verdict"] == "changed"],
        "regressed": [f"{f}@{c}" for c, f, v in perf if v["verdict"] == "regressed" and v["strong"]],
        "improved": [f"{f}@{c}" for c, f, v in perf if v["verdict"] == "improved" and v["strong"]],
        "weak": [f"{f}@{c}" for c, f, v in perf if v["verdict"] != "unchanged" and not v["strong"]],
    }


def exit_code(report: dict, perf: str) -> int:
    """0 same or improved; 1 outputs or scheduler changed, or (``perf`` fail) a strong regression."""
    s = report["summary"]
    if s["outputs_changed"] or s["scheduler_changed"]:
        return 1
    return 1 if perf == "fail" and s["regressed"] else 0


def differences(base: dict, cand: dict) -> list[dict]:
    """Everything that differs besides the workload, labelled by what it is."""
    out = []

    def diff(kind: str, key: str, a, b) -> None:
        if a != b:
            out.append({"kind": kind, "field": key, "baseline": a, "candidate": b})

    for k in ENGINE_KEYS:
        diff("engine", k, base["engine"].get(k), cand["engine"].get(k))
    for k in sorted(set(base["config"]["budget"]) | set(cand["config"]["budget"])):
        diff("budget", k, base["config"]["budget"].get(k), cand["config"]["budget"].get(k))
    for k in ("levels", "repeat", "warmup"):
        diff("run", k, base["config"][k], cand["config"][k])
    for k in MACHINE_KEYS:
        diff("machine", k, base["environment"].get(k), cand["environment"].get(k))
    for k in SOFTWARE_KEYS:
        diff("software", k, base["environment"].get(k), cand["environment"].get(k))
    return out


def _machine(data: dict) -> tuple:
    return tuple(data["environment"].get(k) for k in MACHINE_KEYS)


def _workload(data: dict) -> str:
    w = data["workload"]
    return (
        f"{w['sessions']} sessions, prompts {sorted(set(w['prompt_tokens']))}, new tokens "
        f"{sorted(set(w['new_tokens']))}, seed {w['seed']}"
    )
