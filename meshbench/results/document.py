"""results.json: built from a sweep, validated against the schema, read back strictly."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from meshbench import __version__, files, validation
from meshbench.analysis.figures import SATURATION_MARGIN
from meshbench.analysis.verdicts import ConcurrencySweep
from meshbench.errors import MeshbenchError
from meshbench.records.context import Environment, GgufEngineInfo, InputFile, SyntheticEngineInfo
from meshbench.records.documents import FirstDivergence, NodeResults
from meshbench.workload.config import RunConfig

SCHEMA_VERSION = 4
SCHEMA = "results.schema.json"


def stamp(kind: str, schema_version: int, command: str) -> dict[str, Any]:
    """What a document of its own kind (a matrix, a hunt) opens with: its kind and schema, meshbench's version, the
    time and the command."""
    return {
        "kind": kind,
        "schema_version": schema_version,
        "meshbench_version": __version__,
        "created_at": created_at(),
        "command": command,
    }


def created_at() -> str:
    """When a document was made: UTC, to the second."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def header(cfg: RunConfig, command: str, schema_version: int) -> dict[str, Any]:
    """What every results.json opens with, a node's or an endpoint's: versions, time, command, the config echo."""
    return {
        "schema_version": schema_version,
        "meshbench_version": __version__,
        "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": command,
        "story": cfg.story,
        "title": cfg.title,
        "config": cfg.to_dict(),
    }


def build(
    cfg: RunConfig,
    sweep: ConcurrencySweep,
    engine_info: SyntheticEngineInfo | GgufEngineInfo,
    environment: Environment,
    command: str,
    first_divergence: FirstDivergence | None = None,
    inputs: dict[str, InputFile] | None = None,
) -> NodeResults:
    """results.json's record, complete when built: the config echo, the engine and environment, the level records,
    the sweep's verdicts (the first divergence as explained by the runner, when it was), the input files' digests."""
    return NodeResults(
        **header(cfg, command, SCHEMA_VERSION),
        engine=engine_info,
        workload=cfg.workload.record(),  # the config echo's, checked equal by verify
        budget=cfg.budget,
        environment=environment,
        levels=sweep.levels,
        corruption_free=sweep.corruption_free,
        batch_invariant=sweep.batch_invariant,
        isolation=sweep.isolation,
        first_divergence=first_divergence or sweep.first_divergence,
        saturation_concurrency=sweep.saturation_concurrency,
        saturation_margin=SATURATION_MARGIN,
        reference_concurrency=sweep.reference_concurrency,
        reference=sweep.reference,
        saturation_rates=sweep.saturation_rates,
        inputs=inputs,
    )


ENDPOINT_SCHEMA = "endpoint.schema.json"
ENDPOINT_VERSION = 4  # 2: failed answers fail the verdicts (verdicts.failed); deadline_s in the echo; 3: the
# requests' shared fields and prompt ids, the perturbation, canary and cancel-and-retry runs, all required (a
# bundle of 2 is not read: stripped of them it could not be told from an honest older one); 4: the sibling pass,
# every native margin's runner-up, the perturbation test through the prompt cache and fresh perturbed ids, all
# required (a bundle of 3 is not read: one forged to look like it would escape the checks each of them makes)


def check_node_version(v: Any, where: str) -> None:
    """A node document's schema_version: this meshbench's, or one line saying what to do."""
    if not isinstance(v, int) or isinstance(v, bool):
        raise MeshbenchError(f"{where}: schema_version is missing or not an integer; not a meshbench results file")
    if v > SCHEMA_VERSION:
        raise MeshbenchError(
            f"{where}: schema_version {v} is newer than this meshbench understands ({SCHEMA_VERSION}); "
            "upgrade meshbench to read it"
        )
    if v < SCHEMA_VERSION:
        raise MeshbenchError(
            f"{where}: schema_version {v} was written by an older meshbench (this one writes {SCHEMA_VERSION}, "
            "whose isolation passes draw fresh perturbations every pass, and which records the compute fingerprint); "
            "re-run its sweep command (commands.txt beside it) with this version"
        )


def dumps(data: dict[str, Any]) -> str:
    return json.dumps(data, indent=1, sort_keys=False, allow_nan=False) + "\n"


MAX_BYTES = 256 << 20  # a results.json of 100000 sessions is well under this


def load(path: Path) -> dict[str, Any]:
    """Parse a results.json strictly: a regular UTF-8 file, standard JSON only (no NaN or Infinity)."""
    text = files.read_text(path, "results", MAX_BYTES)
    data = files.strict_json(text, str(path), "a meshbench results file")
    if not isinstance(data, dict):
        raise MeshbenchError(f"{path}: expected a JSON object at the top level")
    bad = validation.unrepresentable(data)
    if bad:
        raise MeshbenchError(f"{path}: {bad}")
    return data
