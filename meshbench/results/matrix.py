"""A settings matrix's bundle (``engine.server_settings``): a results.json of kind ``matrix`` that names each
setting's flags, its folder and the digest of the endpoint bundle in it, beside those bundles. Each setting's
bundle is an endpoint bundle like any other (verify checks it alone too); the matrix's README compares them."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from meshbench import __version__, files, validation
from meshbench.errors import MeshbenchError
from meshbench.names import RESULTS
from meshbench.records import serial
from meshbench.records.matrix import MatrixDocument, MatrixEntry
from meshbench.results import document, kinds
from meshbench.results.typed import EndpointBundle
from meshbench.workload import matrix
from meshbench.workload.config import RunConfig

KIND = kinds.MATRIX
SCHEMA = "matrix.schema.json"
VERSION = 1


@dataclass(frozen=True, slots=True)
class Setting:
    """One setting of the matrix, its bundle read from its folder."""

    flags: str
    folder: str
    results_sha256: str
    data: dict[str, Any]
    bundle: EndpointBundle


def is_matrix(data: Any) -> bool:
    return kinds.of(data) == kinds.MATRIX


def build(command: str, cfg: RunConfig, settings: list[tuple[str, dict[str, Any]]]) -> MatrixDocument:
    """The matrix's results.json: its command and config echo (what ran), and each setting's flags, folder and
    the digest of its results.json as written."""
    assert cfg.story is not None and cfg.title is not None  # (a RunConfig names itself when built)
    return MatrixDocument(
        kind=KIND,
        schema_version=VERSION,
        meshbench_version=__version__,
        created_at=document.created_at(),
        command=command,
        story=cfg.story,
        title=cfg.title,
        server_args=cfg.engine.server_args,
        config=cfg.to_dict(),
        settings=[
            MatrixEntry(flags=flags, folder=matrix.folder(flags), results_sha256=_sha256(document.dumps(d)))
            for flags, d in settings
        ],
    )


def load(path: Path) -> MatrixDocument:
    """A matrix's results.json, schema-valid and of this version, its folders each its flags' own (so no folder
    it names leads out of the bundle), or one line saying what is wrong."""
    rj = path / RESULTS
    data = document.load(rj)
    if not is_matrix(data):
        raise MeshbenchError(f"{rj}: not a settings matrix")
    if data.get("schema_version") != VERSION:
        raise MeshbenchError(
            f"{rj}: a settings matrix of schema_version {data.get('schema_version')!r}; this meshbench reads {VERSION}"
        )
    errors = validation.errors(data, SCHEMA)
    if errors:
        raise MeshbenchError(f"{rj}: fails the matrix schema: {errors[0]}")
    doc = serial.matrix_document(data, str(rj))
    seen = set()
    for s in doc.settings:
        if s.folder != matrix.folder(s.flags) or s.folder in seen:
            raise MeshbenchError(
                f"{rj}: settings {s.flags!r}: folder {s.folder!r} is not its own ({matrix.folder(s.flags)}) or is "
                "named twice"
            )
        seen.add(s.folder)
    return doc


def settings(path: Path, doc: MatrixDocument, load_bundle: Any) -> list[Setting]:
    """Each setting's bundle, read by ``load_bundle`` (verify's: schema and version checked) and typed."""
    return [setting(s, load_bundle(path / s.folder), path) for s in doc.settings]


def setting(entry: MatrixEntry, sub: dict[str, Any], path: Path | None = None) -> Setting:
    """A setting of the matrix (its entry in the matrix's results.json) with its bundle's results."""
    if kinds.of(sub) != kinds.ENDPOINT:
        where = entry.folder if path is None else path / entry.folder
        raise MeshbenchError(f"{where}: not an endpoint bundle (a matrix holds one per setting)")
    return Setting(entry.flags, entry.folder, entry.results_sha256, sub, kinds.typed_results(sub))


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def digest(path: Path) -> str:
    return files.sha256(path / RESULTS)
