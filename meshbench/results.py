"""results.json: built from a sweep, validated against the schema, written atomically."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import tempfile
from datetime import datetime, timezone
from pathlib import Path

from meshbench import __version__, files, validation
from meshbench.config import RunConfig
from meshbench.errors import MeshbenchError
from meshbench.scheduler.budget import NodeBudget
from meshbench.sweep import SATURATION_MARGIN, ConcurrencySweep, level_budget

SCHEMA_VERSION = 1
SCHEMA = "results.schema.json"


def _finite(x):
    """JSON has no inf/nan: a margin that is not finite is recorded as null."""
    return x if isinstance(x, (int, float)) and math.isfinite(x) else None


def build(cfg: RunConfig, sweep: ConcurrencySweep, engine_info: dict, environment: dict, command: str) -> dict:
    base = NodeBudget(**cfg.budget)
    levels = []
    for r in sweep.levels:
        lb = level_budget(base, r.concurrency, cfg.workload.sessions)
        sessions = []
        for s in r.sessions:
            d = dataclasses.asdict(s)
            d["margins"] = [_finite(m) for m in s.margins]
            sessions.append(d)
        levels.append({
            "concurrency": r.concurrency,
            "budget": lb.to_dict(),
            "ticks": r.ticks,
            "avg_batch_occupancy": r.avg_batch_occupancy,
            "max_batch_occupancy": r.max_batch_occupancy,
            "tokens_per_tick": r.tokens_per_tick,
            "peak_kv_bytes": r.peak_kv_bytes,
            "prefill_tokens": r.prefill_tokens,
            "decode_tokens": r.decode_tokens,
            "rejected_admissions": r.rejected_admissions,
            "cache_misses": r.cache_misses,
            "failed": r.failed,
            "sessions": sessions,
            "tick_records": [t.to_dict() for t in r.tick_records],
            "wall": r.wall,
        })
    div = sweep.first_divergence
    if div is not None:
        div = dict(div, reference_margin=_finite(div.get("reference_margin")))
    return {
        "schema_version": SCHEMA_VERSION,
        "meshbench_version": __version__,
        "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": command,
        "story": cfg.story,
        "title": cfg.title,
        "config": cfg.to_dict(),
        "engine": engine_info,
        "workload": cfg.workload.to_dict(),
        "budget": base.to_dict(),
        "environment": environment,
        "levels": levels,
        "corruption_free": sweep.corruption_free,
        "first_divergence": div,
        "saturation_concurrency": sweep.saturation_concurrency,
        "saturation_margin": SATURATION_MARGIN,
        "reference_concurrency": sweep.reference_concurrency,
    }


def check_version(data: dict, where: str) -> None:
    v = data.get("schema_version") if isinstance(data, dict) else None
    if not isinstance(v, int) or isinstance(v, bool):
        raise MeshbenchError(f"{where}: schema_version is missing or not an integer; not a meshbench results file")
    if v > SCHEMA_VERSION:
        raise MeshbenchError(
            f"{where}: schema_version {v} is newer than this meshbench understands ({SCHEMA_VERSION}); "
            "upgrade meshbench to read it"
        )
    if v < 1:
        raise MeshbenchError(f"{where}: schema_version {v} is unknown")


def schema_errors(data: dict) -> list[str]:
    return validation.errors(data, SCHEMA)


def dumps(data: dict) -> str:
    return json.dumps(data, indent=1, sort_keys=False, allow_nan=False) + "\n"


def write_atomic(path: Path, text: str) -> None:
    """Write to a temporary file beside ``path`` and rename: never half a file."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


MAX_BYTES = 256 << 20  # a results.json of 100000 sessions is well under this


def _no_constant(name: str):
    raise ValueError(f"{name} is not JSON (meshbench never writes it)")


def load(path: Path) -> dict:
    """Parse a results.json strictly: a regular UTF-8 file, standard JSON only (no NaN or Infinity)."""
    text = files.read_text(path, "results", MAX_BYTES)
    try:
        data = json.loads(text, parse_constant=_no_constant)
    except json.JSONDecodeError as e:
        raise MeshbenchError(f"{path}: not valid JSON (line {e.lineno}, column {e.colno}): {e.msg}") from None
    except ValueError as e:
        raise MeshbenchError(f"{path}: not valid JSON: {e}") from None
    except RecursionError:
        raise MeshbenchError(f"{path}: nested too deeply to be a meshbench results file") from None
    if not isinstance(data, dict):
        raise MeshbenchError(f"{path}: expected a JSON object at the top level")
    return data
