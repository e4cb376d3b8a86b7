"""The registry of bundle kinds (meshbench.results.kinds): a node's sweep, an endpoint's, a matrix of server settings
and a hunt. Every table keyed by bundle kind, in every layer, covers exactly the registry's kinds; no code outside
the registry decides by a bundle kind's name or by the type of a typed bundle; and a new kind is one entry in each
table, shown by a toy kind that verify and the evidence index then handle."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from meshbench.analysis.checks import Checks
from meshbench.cli import app
from meshbench.cli import sweep as cli_sweep
from meshbench.cli import verify as cli_verify
from meshbench.compare import sides
from meshbench.errors import MeshbenchError
from meshbench.results import index, kinds
from meshbench.verify import bundle as verify_bundle
from tests.test_engine_kinds import _kind_like, scan

runner = CliRunner()


def test_every_table_by_bundle_kind_covers_the_registry():
    every = set(kinds.FOLDERS)
    sweeps = {k.name for k in kinds.FOLDERS.values() if k.sweep}
    assert every == {"node", "endpoint", "matrix", "hunt"} and sweeps == {"node", "endpoint"}
    assert set(index.ROWS) == every
    assert set(cli_verify.VERIFIERS) == every
    assert set(kinds.KINDS) == sweeps
    assert set(verify_bundle.VERIFIES) == sweeps
    assert set(sides.SIDES) == sweeps
    assert set(cli_sweep.SUMMARIES) == sweeps
    assert set(cli_sweep.RUNS) == sweeps


@pytest.mark.parametrize(
    ("data", "kind"),
    [
        ({"kind": "endpoint"}, "endpoint"),
        ({"kind": "matrix"}, "matrix"),
        ({"kind": "hunt"}, "hunt"),
        ({"schema_version": 4}, "node"),
        ({"kind": "toy"}, "node"),  # (a kind of no bundle: the node's schema refuses it, in one line)
        ({"kind": ["hunt"]}, "node"),
        ([], "node"),
    ],
)
def test_a_document_s_kind_is_what_it_says_else_a_node_s(data, kind):
    assert kinds.of(data) == kind


@pytest.mark.parametrize("kind", ["matrix", "hunt"])
def test_a_bundle_of_its_own_kind_is_not_read_as_one_sweep(kind):
    with pytest.raises(MeshbenchError) as e:
        kinds.check_version({"kind": kind, "schema_version": 1}, "results.json")
    assert "not one sweep's bundle (meshbench verify FOLDER checks it whole" in str(e.value)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("said", ["hunt ", "HUNT", ["hunt"], 7, {}, False])
def test_a_kind_no_bundle_has_is_named_in_one_line(said):
    with pytest.raises(MeshbenchError) as e:
        kinds.check_version({"kind": said, "schema_version": 1}, "results.json")
    assert "is no kind of meshbench bundle (node, endpoint, matrix, hunt" in str(e.value) and "\n" not in str(e.value)


def _decides_by_bundle_kind(tree: ast.AST) -> list[int]:
    """Lines deciding by a bundle kind written out (something's kind compared with "node", "matrix", "hunt"), or by
    the type of a typed bundle (``isinstance`` with one of its classes)."""
    names, classes = {"node", "matrix", "hunt"}, {"NodeBundle", "EndpointBundle", "NodeResults", "EndpointResults"}
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            sides_ = [node.left, *node.comparators]
            written = any(isinstance(s, ast.Constant) and s.value in names for s in sides_)
            if written and any(_kind_like(s) for s in sides_):
                lines.append(node.lineno)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "isinstance":
            if any(isinstance(n, ast.Name) and n.id in classes for a in node.args[1:] for n in ast.walk(a)):
                lines.append(node.lineno)
    return sorted(lines)


def test_no_code_outside_the_registry_decides_by_a_bundle_kind():
    found = scan(_decides_by_bundle_kind, skip="kinds.py")
    assert found == {}


def test_the_bundle_kind_scan_sees_each_form():
    src = "\n".join(
        ['a = d.get("kind") == "matrix"', 'b = s.kind == "node"', 'c = isinstance(t, NodeBundle)',
         'd = isinstance(t.results, (EndpointResults, int))', 'e = x.name == "hunt"', 'f = isinstance(t, dict)']
    )  # fmt: skip
    assert _decides_by_bundle_kind(ast.parse(src)) == [1, 2, 3, 4]


def test_a_toy_kind_is_one_entry_in_each_table(tmp_path, monkeypatch):
    """A kind of bundle registered in the registry, the index and verify: verify checks its folder its own way, and
    the evidence index gives its row; nothing else is edited."""
    monkeypatch.setitem(kinds.FOLDERS, "toy", kinds.Folder("toy", "a toy bundle", sweep=False))

    def verify_toy(path: Path, rerun: bool, trust_endpoints: bool, threads: int | None) -> Checks:
        c = Checks()
        c.equal("results.json", "toys", 3, json.loads((path / "results.json").read_text())["toys"])
        return c

    monkeypatch.setitem(cli_verify.VERIFIERS, "toy", verify_toy)
    monkeypatch.setitem(index.ROWS, "toy", lambda folder, d: f"| {folder.name} | {d['toys']} toys |")
    (tmp_path / "T").mkdir()
    (tmp_path / "T" / "results.json").write_text(json.dumps({"kind": "toy", "toys": 3}))
    r = runner.invoke(app, ["verify", str(tmp_path / "T")])
    assert r.exit_code == 0 and "ok: 1 checks" in r.output, r.output
    assert "| T | 3 toys |" in index.render(tmp_path)
    (tmp_path / "T" / "results.json").write_text(json.dumps({"kind": "toy", "toys": 4}))
    assert runner.invoke(app, ["verify", str(tmp_path / "T")]).exit_code == 1
    with pytest.raises(MeshbenchError, match="a toy bundle, not one sweep's bundle"):
        kinds.check_version({"kind": "toy"}, "results.json")


def test_verify_writes_a_folder_s_name_escaped_on_its_error_line(tmp_path):
    """A folder's name is the user's: its control characters never start a line of their own or a colour."""
    d = tmp_path / "Q\x1b[32m\nfake: ok"
    d.mkdir()
    r = runner.invoke(app, ["verify", str(d)])
    assert r.exit_code == 2 and len(r.output.strip().splitlines()) == 1 and "\\x1b[32m\\nfake" in r.output
