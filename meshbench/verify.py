"""verify: many small named checks over an evidence bundle, every failure reported.

Each failure reads ``<file>: <field> expected=<x> found=<y>``. Problems that make a
bundle unusable (no folder, no results.json, not JSON, a newer schema_version, a
schema violation) raise MeshbenchError instead: there is nothing to check.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from meshbench import bundle, config, files, report, results, validation
from meshbench.errors import MeshbenchError
from meshbench.sweep import SATURATION_MARGIN, first_divergence, saturation_level, summarize_ticks, token_digest

WALL_CLOCK_TICK_FIELDS = ("tick_ns", "engine_ns")


@dataclass(frozen=True, slots=True)
class Failure:
    file: str
    field: str
    expected: object
    found: object

    def __str__(self) -> str:
        return f"{self.file}: {self.field} expected={self.expected} found={self.found}"


class Checks:
    def __init__(self) -> None:
        self.failures: list[Failure] = []
        self.count = 0

    def equal(self, file: str, field: str, expected, found) -> None:
        self.count += 1
        same = (math.isclose(expected, found, rel_tol=1e-12, abs_tol=1e-12)
                if isinstance(expected, float) or isinstance(found, float) else expected == found)
        if not same:
            self.failures.append(Failure(file, field, expected, found))


def load_bundle(path: Path) -> dict:
    if not path.exists():
        raise MeshbenchError(f"{path}: no such directory")
    if not path.is_dir():
        raise MeshbenchError(f"{path}: not a directory (a bundle is a folder holding results.json)")
    rj = path / bundle.RESULTS
    if not rj.exists():
        raise MeshbenchError(f"{path}: not a bundle: no {bundle.RESULTS}")
    data = results.load(rj)
    results.check_version(data, str(rj))
    try:
        errors = results.schema_errors(data) or config_echo_errors(data["config"])
    except RecursionError:
        raise MeshbenchError(f"{rj}: nested too deeply to be a meshbench results file") from None
    if errors:
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        raise MeshbenchError(f"{rj}: fails the results schema: {errors[0]}{more}")
    return data


def config_echo_errors(echo: dict) -> list[str]:
    """The config echo must be a whole config: valid against the config schema, every key present."""
    errors = [f"config.{e}" for e in validation.errors(echo, "config.schema.json")]
    for key, default in config.DEFAULTS.items():
        if key not in echo:
            errors.append(f"config: '{key}' is missing")
        elif isinstance(default, dict):
            errors += [f"config.{key}: '{k}' is missing" for k in default if k not in echo[key]]
    return errors


def check_bundle(path: Path, rerun: bool = False) -> Checks:
    data = load_bundle(path)
    c = check_data(data)
    check_readme(c, data, path)
    if rerun:
        check_rerun(c, data, path)
    return c


def check_data(data: dict) -> Checks:
    """Every check that needs only the results (what ``sweep`` runs on its own output)."""
    c = Checks()
    check_levels(c, data)
    check_sessions(c, data)
    check_sweep(c, data)
    return c


def check_levels(c: Checks, data: dict) -> None:
    F = bundle.RESULTS
    bpt = data["engine"]["kv_bytes_per_token"]
    for i, lv in enumerate(data["levels"]):
        at = f"levels[{i}]"
        for k, v in summarize_ticks(lv["tick_records"]).items():
            c.equal(F, f"{at}.{k}", v, lv[k])
        sessions = lv["sessions"]
        prefilled = {sid for t in lv["tick_records"] for sid in t["prefill_sessions"]}
        by_id = {s["session_id"]: s for s in sessions}
        c.equal(F, f"{at}.prefill_tokens (sum of prefilled prompts)",
                sum(by_id[sid]["prompt_tokens"] for sid in prefilled if sid in by_id), lv["prefill_tokens"])
        c.equal(F, f"{at}.sessions tokens (prefills + decode_tokens)",
                len(prefilled) + lv["decode_tokens"], sum(len(s["tokens"]) for s in sessions))
        for t in lv["tick_records"]:
            if lv["cache_misses"] == 0:
                c.equal(F, f"{at}.tick_records[{t['tick']}].kv_bytes (stored_tokens x {bpt})",
                        t["stored_tokens"] * bpt, t["kv_bytes"])
            else:  # an evicted session holds no KV until the scheduler sees its miss
                c.equal(F, f"{at}.tick_records[{t['tick']}].kv_bytes <= stored_tokens x {bpt}",
                        True, t["kv_bytes"] <= t["stored_tokens"] * bpt)
            c.equal(F, f"{at}.tick_records[{t['tick']}].decode_batch", len(t["decode_sessions"]), t["decode_batch"])
        if lv["tick_records"]:
            c.equal(F, f"{at}.tick_records[-1].kv_bytes (all KV released)", 0, lv["tick_records"][-1]["kv_bytes"])
        for j, s in enumerate(sessions):
            sat = f"{at}.sessions[{j}]"
            c.equal(F, f"{sat}.digest", token_digest(s["tokens"]), s["digest"])
            if s["done_reason"] == "COMPLETED":
                c.equal(F, f"{sat}.tokens (count)", s["max_new_tokens"], len(s["tokens"]))
            if s["done_reason"] in ("FAILED", "UNFINISHED"):
                c.equal(F, f"{sat}.done_reason", "COMPLETED", f"{s['done_reason']} ({s['error']})")
        c.equal(F, f"{at}.cache_misses", sum(s["done_reason"] == "CACHE_MISS" for s in sessions), lv["cache_misses"])
        c.equal(F, f"{at}.failed", sum(s["done_reason"] == "FAILED" for s in sessions), lv["failed"])
        c.equal(F, f"{at}.failed (no session may fail)", 0, lv["failed"])
        c.equal(F, f"{at}.sessions (count)", data["workload"]["sessions"] - lv["rejected_admissions"], len(sessions))


def check_sessions(c: Checks, data: dict) -> None:
    """Every level serves exactly the workload's sessions, each with its own prompt and length."""
    F = bundle.RESULTS
    w = data["workload"]
    n = w["sessions"]
    width = len(str(n - 1))
    expected = {f"s{i:0{width}d}": i for i in range(n)}  # the names Workload.requests gives
    ref_ids = None
    for i, lv in enumerate(data["levels"]):
        at = f"levels[{i}]"
        ids = [s["session_id"] for s in lv["sessions"]]
        c.equal(F, f"{at}.sessions ids unique", len(ids), len(set(ids)))
        unknown = sorted(set(ids) - set(expected))
        c.equal(F, f"{at}.sessions ids not in the workload", [], unknown)
        if ref_ids is None:
            ref_ids = sorted(set(ids))
        else:
            c.equal(F, f"{at}.sessions ids (same as levels[0])", ref_ids, sorted(set(ids)))
        for j, s in enumerate(lv["sessions"]):
            k = expected.get(s["session_id"])
            if k is not None:
                c.equal(F, f"{at}.sessions[{j}].prompt_tokens", w["prompt_tokens"][k], s["prompt_tokens"])
                c.equal(F, f"{at}.sessions[{j}].max_new_tokens", w["new_tokens"][k], s["max_new_tokens"])
        named = {sid for t in lv["tick_records"]
                 for sid in (*t["decode_sessions"], *t["prefill_sessions"], *t["completed"])}
        c.equal(F, f"{at}.tick_records session ids not among the level's sessions", [],
                sorted(named - set(ids)))


def check_sweep(c: Checks, data: dict) -> None:
    F = bundle.RESULTS
    levels = data["levels"]
    ref = levels[0]
    ref_map = {s["session_id"]: (s["tokens"], s["margins"]) for s in ref["sessions"]}
    div = None
    for lv in levels[1:]:
        div = first_divergence(ref["concurrency"], ref_map, lv["concurrency"],
                               [(s["session_id"], s["tokens"]) for s in lv["sessions"]])
        if div:
            break
    unfinished = sum(s["done_reason"] in ("FAILED", "UNFINISHED") for lv in levels for s in lv["sessions"])
    c.equal(F, "corruption_free (no divergence, no failed session)", div is None and unfinished == 0,
            data["corruption_free"])
    found = data["first_divergence"]
    if found is not None:
        found = {k: found[k] for k in div} if div else found
    c.equal(F, "first_divergence", div, found)
    c.equal(F, "reference_concurrency", ref["concurrency"], data["reference_concurrency"])
    # The margin is meshbench's constant, not the bundle's to choose.
    c.equal(F, "saturation_margin", SATURATION_MARGIN, data["saturation_margin"])
    c.equal(F, "saturation_concurrency",
            saturation_level([lv["concurrency"] for lv in levels], [lv["avg_batch_occupancy"] for lv in levels],
                             SATURATION_MARGIN),
            data["saturation_concurrency"])


def check_readme(c: Checks, data: dict, path: Path) -> None:
    F = bundle.README
    readme = path / bundle.README
    if not readme.is_file():
        c.equal(F, "(file)", "present", "missing")
        return
    rows = report.parse_table(files.read_text(readme, "README", bundle.MAX_RESULTS_BYTES))
    if rows is None:
        c.equal(F, "sweep table", "present", "missing")
        return
    expected = report.table_rows(data)
    c.equal(F, "sweep table rows", len(expected), len(rows))
    for i, (e_row, f_row) in enumerate(zip(expected, rows)):
        for name, e, f in zip(report.TABLE_FIELDS, e_row, f_row + [""] * (len(e_row) - len(f_row))):
            c.equal(F, f"levels[{i}].{name}", e, f)


def deterministic_view(data: dict) -> dict:
    """Every field a rerun must reproduce exactly; wall-clock and environment excluded."""
    out = {"engine.recipe_fingerprint": data["engine"]["recipe_fingerprint"],
           "engine.model_sha256": data["engine"].get("model_sha256"),
           "corruption_free": data["corruption_free"], "saturation_concurrency": data["saturation_concurrency"]}
    for i, lv in enumerate(data["levels"]):
        at = f"levels[{i}]"
        for k in ("concurrency", "ticks", "avg_batch_occupancy", "max_batch_occupancy", "tokens_per_tick",
                  "peak_kv_bytes", "prefill_tokens", "decode_tokens", "rejected_admissions", "cache_misses",
                  "failed"):
            out[f"{at}.{k}"] = lv[k]
        for j, s in enumerate(lv["sessions"]):
            out[f"{at}.sessions[{j}].digest"] = s["digest"]
        for t in lv["tick_records"]:
            for k, v in t.items():
                if k not in WALL_CLOCK_TICK_FIELDS:
                    out[f"{at}.tick_records[{t['tick']}].{k}"] = v
    return out


def check_rerun(c: Checks, data: dict, path: Path) -> None:
    from meshbench.run import rerun_results  # noqa: PLC0415 - the heavy path, only with --rerun

    fresh = rerun_results(data)
    old, new = deterministic_view(data), deterministic_view(fresh)
    for k in sorted(set(old) | set(new)):
        c.equal(f"{bundle.RESULTS} (rerun)", k, new.get(k, "(absent)"), old.get(k, "(absent)"))
