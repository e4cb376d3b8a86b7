"""The records of a settings matrix's results.json (matrix.schema.json): what ran, and each setting's flags,
folder and the digest of the endpoint bundle in it (meshbench.results.matrix writes and reads it)."""

from __future__ import annotations

from dataclasses import dataclass

from meshbench.records.model import JsonObject


@dataclass(frozen=True, slots=True, kw_only=True)
class MatrixEntry:
    """One setting: its own flags, as given, its bundle's folder beside the matrix's results.json, and the digest
    of that bundle's results.json as written."""

    flags: str
    folder: str
    results_sha256: str


@dataclass(frozen=True, slots=True, kw_only=True)
class MatrixDocument:
    """A settings matrix's results.json, whole."""

    kind: str
    schema_version: int
    meshbench_version: str
    created_at: str
    command: str
    story: str
    title: str
    server_args: str | None  # the matrix's own flags (engine.server_args), before each setting's
    config: JsonObject  # the matrix's config echo (meshbench.workload.config.from_mapping types it)
    settings: list[MatrixEntry]
