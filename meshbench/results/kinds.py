"""The kinds of bundle, and what each registers: one sweep's records (a node's, a served endpoint's), and the
bundles of their own kind, a matrix of server settings (a folder of endpoint sweeps) and a hunt.

``of(data)`` is the one place that tells them apart, by the ``kind`` its results.json says (a node's says none):
every other module looks its kind's part up by name instead of branching on it. ``FOLDERS`` names every kind;
``KINDS`` holds those of one sweep's records, each with its schema and version, its README and commands.txt
renderers, its evidence-index row and whether it draws a chart. The layers above register theirs under the same
names, and tests/test_bundle_kinds.py holds each table to the registry: the index its row of any bundle
(``meshbench.results.index.ROWS``), verify its check of any bundle folder (``meshbench.cli.verify.VERIFIERS``) and
of one sweep's records (``meshbench.verify.bundle.CHECKS``, ``TABLES``), compare its reduction to the sides it
compares (``meshbench.compare.sides.SIDES``), the CLI its sweep and printed summary (``meshbench.cli.sweep.RUNS``,
``SUMMARIES``).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from meshbench import validation
from meshbench.engine import kinds as engine_kinds
from meshbench.errors import MeshbenchError
from meshbench.names import RESULTS
from meshbench.results import document, endpoint_report, index_rows, report, typed

NODE = "node"
ENDPOINT = "endpoint"
MATRIX = "matrix"
HUNT = "hunt"


@dataclass(frozen=True, slots=True)
class Folder:
    """A kind of bundle folder, as verify and the index name it."""

    name: str
    what: str  # in words
    sweep: bool  # one sweep's records (in KINDS); else a bundle verified as a whole, its own way


FOLDERS = {
    k.name: k
    for k in (
        Folder(NODE, "a node's sweep", sweep=True),
        Folder(ENDPOINT, "a served endpoint's sweep", sweep=True),
        Folder(MATRIX, "a matrix of server settings", sweep=False),
        Folder(HUNT, "a hunt for cross-request bugs", sweep=False),
    )
}


def of(data: Any) -> str:
    """A results document's kind: the one of ``FOLDERS`` its ``kind`` says, else ``node`` (a node's document says
    none; a document of no kind meshbench knows is left to the node's schema to refuse)."""
    said = data.get("kind") if isinstance(data, dict) else None
    return said if isinstance(said, str) and said in FOLDERS else NODE


def of_folder(path: Path) -> str:
    """The kind of the bundle in folder ``path``, by its results.json, read as verify reads any (a regular file,
    strict JSON: never a FIFO waited on); one that cannot be read is a node's here, left to the node's loading,
    which says what is wrong with it."""
    try:
        return of(document.load(path / RESULTS))
    except (MeshbenchError, OSError):
        return NODE


def of_engine(engine_kind: str) -> str:
    """The kind of bundle an engine kind makes: a served endpoint's, or a node's (synthetic, gguf)."""
    return NODE if engine_kinds.recorded(engine_kind).own else ENDPOINT


@dataclass(frozen=True, slots=True)
class BundleKind:
    name: str
    schema: str  # the schema file in meshbench.schemas
    version: int  # the schema_version this meshbench writes and reads
    typed: Callable[[Any], Any]  # results.json (schema-valid) -> its records and config (meshbench.results.typed)
    bundled: Callable[[Any], Any]  # a sweep's document record, as built -> the same typed bundle, no JSON between
    readme: Callable[[Any, str], str]  # (typed results, quoted bundle name) -> README.md
    commands: Callable[[Any, str], str]  # (typed results, quoted bundle name) -> commands.txt
    index_row: Callable[[Path, Any], str]  # (bundle folder, typed results) -> its row of evidence/INDEX.md
    chart: bool  # a chart.png of its curve (an endpoint's figures are its README's table)
    rerun: bool  # verify --rerun can run it again here (an endpoint's rerun needs its server)


KINDS = {
    NODE: BundleKind(
        name=NODE,
        schema=document.SCHEMA,
        version=document.SCHEMA_VERSION,
        typed=typed.node,
        bundled=typed.node_bundle,
        readme=report.render_readme,
        commands=report.render_commands,
        index_row=index_rows.node_row,
        chart=True,
        rerun=True,
    ),
    ENDPOINT: BundleKind(
        name=ENDPOINT,
        schema=document.ENDPOINT_SCHEMA,
        version=document.ENDPOINT_VERSION,
        typed=typed.endpoint,
        bundled=typed.endpoint_bundle,
        readme=endpoint_report.render_readme,
        commands=endpoint_report.render_commands,
        index_row=index_rows.endpoint_row,
        chart=False,
        rerun=False,
    ),
}


def kind(data: Any) -> BundleKind:
    """The kind of one sweep's records ``data`` is (check_version has refused a bundle of another kind)."""
    return KINDS[of(data)]


def typed_results(data: dict[str, Any]) -> Any:
    """A schema-valid document typed as its kind's records (a NodeBundle or an EndpointBundle)."""
    return kind(data).typed(data)


def readme(data: dict[str, Any], bundle_name: str) -> str:
    """The bundle's README.md, as its kind renders it; the name is one shell word in the commands a reader pastes."""
    return kind(data).readme(typed_results(data), shlex.quote(bundle_name))


def index_row(folder: Path, data: dict[str, Any]) -> str:
    """The bundle's row of evidence/INDEX.md."""
    return kind(data).index_row(folder, typed_results(data))


OLDER_ENDPOINT = 3  # an endpoint schema_version read only where pinned (verify --older), under its own rules
PINNED: set[str] = set()  # sha256 digests of results.json files verify may read at OLDER_ENDPOINT (--older)


def check_version(data: Any, where: str, digest: str | None = None) -> None:
    """A document of the schema_version this meshbench reads for its kind, or one line saying what to do. An
    endpoint document of OLDER_ENDPOINT is read only where its ``digest`` is pinned: stripped of what schema 4
    requires, a forged bundle would read as an honest older one, so an older one is accepted by its digest alone."""
    v = data.get("schema_version") if isinstance(data, dict) else None
    said = data.get("kind") if isinstance(data, dict) else None
    if said is not None and not (isinstance(said, str) and said in FOLDERS):  # (a node's document says no kind)
        raise MeshbenchError(
            f"{where}: kind {str(said)[:40]!r} is no kind of meshbench bundle ({', '.join(FOLDERS)}; a node's says "
            "none)"
        )
    folder = FOLDERS[of(data)]
    if not folder.sweep:
        raise MeshbenchError(
            f"{where}: {folder.what}, not one sweep's bundle (meshbench verify FOLDER checks it whole"
            + ("; one setting's bundle is a folder beside it" if folder.name == MATRIX else "")
            + ")"
        )
    k = kind(data)
    if k.name == ENDPOINT:
        if v == OLDER_ENDPOINT and digest is not None and digest in PINNED:
            return
        if v != k.version:
            raise MeshbenchError(
                f"{where}: an endpoint bundle of schema_version {v!r}; this meshbench reads {k.version} (re-run "
                "its sweep command, commands.txt beside it, with this version; a bundle of 3 is read only where "
                "verify --older pins its digest)"
            )
        return
    document.check_node_version(v, where)


def schema_errors(data: dict[str, Any]) -> list[str]:
    """The document against its kind's schema."""
    return validation.errors(data, kind(data).schema)
