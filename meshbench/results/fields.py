"""How verify holds every field of results.json: compared by --rerun, recomputed by plain verify, wall-clock
data with its plausibility checks, or provenance. ``tests/test_fields.py`` walks the results schema and fails
on a field in none of them, and mutates fields of a real bundle to prove the first two kinds are caught.

A field takes the class of its longest listed prefix (``levels[]`` stands for every level).
"""

from __future__ import annotations

from meshbench.analysis import figures

# Per-level counts the scheduler reports beside the tick figures; with figures.TICK_FIGURES
# and the level's concurrency, every deterministic per-level field of results.json.
LEVEL_COUNTS = ("rejected_admissions", "cache_misses", "failed")
DETERMINISTIC_LEVEL_FIELDS = (
    "concurrency",
    "faults",
    *figures.TICK_FIGURES,
    *LEVEL_COUNTS,
    "counts",
    "fault_events",
    "engine_losses",
    "submit_events",
    "turn_events",
    "backpressure",
    "isolation",
    "isolation_verdict",
)

RERUN = "rerun"  # a fresh run of the recorded config must reproduce it exactly (verify --rerun)
RECOMPUTED = "recomputed"  # plain verify recomputes it from other records, or checks it against them
WALL = "wall"  # measured time: reported; checked for plausibility (meshbench.verify.timing)
PROVENANCE = "provenance"  # who, when, where: recorded, schema-checked, not reproducible by nature

CLASSES: dict[str, str] = {
    "schema_version": RECOMPUTED,
    "meshbench_version": PROVENANCE,
    "created_at": PROVENANCE,
    "command": PROVENANCE,
    "story": PROVENANCE,
    "title": PROVENANCE,
    "environment": PROVENANCE,
    "config": RECOMPUTED,  # validated as a whole config; re-run as recorded by --rerun
    "workload": RECOMPUTED,
    "budget": RECOMPUTED,  # copies of the config echo's
    "engine": RERUN,  # the whole record, the recipe fingerprint and model digest included
    "engine.rpc": PROVENANCE,  # the workers' endpoints are free ports, new every run
    "engine.model": PROVENANCE,  # a path; the file's sha256 is compared
    "engine.recipe_auto": RECOMPUTED,  # what decided an auto setting here: held to the record and the echo
    "corruption_free": RECOMPUTED,
    "batch_invariant": RECOMPUTED,
    "isolation": RECOMPUTED,
    "first_divergence": RECOMPUTED,
    "first_divergence.classification": RERUN,
    "first_divergence.logit_deviation": RERUN,
    "saturation_concurrency": RECOMPUTED,
    "saturation_margin": RECOMPUTED,
    "saturation_rates": RECOMPUTED,
    "reference_concurrency": RECOMPUTED,
    "reference": RERUN,
    "inputs": RERUN,  # an input file's sha256: a rerun refuses a file that changed
    "levels": RECOMPUTED,
    "levels[].concurrency": RERUN,
    "levels[].arrivals": RECOMPUTED,
    "levels[].rate": RECOMPUTED,
    "levels[].arrival_times": RECOMPUTED,
    "levels[].budget": RECOMPUTED,
    "levels[].faults": RERUN,
    "levels[].ticks": RECOMPUTED,
    "levels[].avg_batch_occupancy": RECOMPUTED,
    "levels[].max_batch_occupancy": RECOMPUTED,
    "levels[].tokens_per_tick": RECOMPUTED,
    "levels[].peak_kv_bytes": RECOMPUTED,
    "levels[].prefill_tokens": RECOMPUTED,
    "levels[].decode_tokens": RECOMPUTED,
    "levels[].rejected_admissions": RECOMPUTED,
    "levels[].cache_misses": RECOMPUTED,
    "levels[].failed": RECOMPUTED,
    "levels[].counts": RERUN,
    "levels[].fault_events": RERUN,
    "levels[].engine_losses": RERUN,
    "levels[].submit_events": RERUN,
    "levels[].submit_events[].arrival_ms": WALL,
    "levels[].submit_events[].submit_ms": WALL,
    "levels[].backpressure": RECOMPUTED,
    "levels[].sessions": RERUN,
    "levels[].sessions[].digest": RECOMPUTED,
    "levels[].tick_records": RERUN,
    "levels[].isolation": RERUN,
    "levels[].isolation_verdict": RECOMPUTED,
    "levels[].repetitions": RECOMPUTED,
    "levels[].repetitions[].tick_records[].tick_ns": WALL,
    "levels[].repetitions[].tick_records[].decode_ns": WALL,
    "levels[].repetitions[].tick_records[].prefill_ns": WALL,
    "levels[].repetitions[].sessions[].submit_ns": WALL,
    "levels[].repetitions[].sessions[].admit_ns": WALL,
    "levels[].repetitions[].sessions[].token_ns": WALL,
    "levels[].repetitions[].wall_s": WALL,
    "levels[].repetitions[].wall": RECOMPUTED,
    "levels[].wall": RECOMPUTED,
    "levels[].turn_events": RERUN,
    "levels[].prefix": RECOMPUTED,  # from the sessions' cached positions and the ticks
    "levels[].cache_off": RERUN,  # the level run once more with the prefix cache off
    "levels[].cache_off[].digest": RECOMPUTED,
    "levels[].cache_verdict": RECOMPUTED,
    "levels[].cache_verdict.own_kv": RERUN,  # the own-KV replay's finding: taken as recorded, replayed by --rerun
}


def class_of(path: str) -> str | None:
    """The class of a schema path (``levels[].sessions[].tokens``): its longest listed prefix's."""
    best = None
    for prefix in CLASSES:
        if path == prefix or path.startswith(prefix + ".") or path.startswith(prefix + "["):
            if best is None or len(prefix) > len(best):
                best = prefix
    return None if best is None else CLASSES[best]
