"""README.md and docs/ stay current: evidence tables equal the committed bundles, the CLI reference is the
app's own, the evidence index is the bundles'."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from meshbench.records import serial
from meshbench.results import endpoint_report, fault_report, kinds, matrix_report, report
from meshbench.results import index as evidence_index
from meshbench.results import matrix as settings_matrix

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
DOCS = "\n".join(p.read_text() for p in sorted((ROOT / "docs").rglob("*.md")))
BUNDLES = sorted(p for p in (ROOT / "evidence").iterdir() if (p / "results.json").is_file())


def test_readme_is_short_and_links_the_docs():
    assert len(README.splitlines()) <= 120, len(README.splitlines())
    for page in (
        "docs/concepts/determinism.md",
        "docs/concepts/figures.md",
        "docs/guides/check-a-server.md",
        "docs/guides/ci-gate.md",
        "docs/development.md",
        "docs/evidence.md",
        "docs/performance.md",
        "docs/reference/cli.md",
        "evidence/INDEX.md",
        "docs/architecture.md",
    ):
        assert page in README and (ROOT / page).is_file(), page


def test_every_relative_link_in_the_readme_and_docs_resolves():
    import re

    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    # a matrix bundle's table, quoted whole, links its settings' folders from inside the bundle
    settings = {f"{p.parent.name}/README.md" for p in (ROOT / "evidence").glob("*/*/results.json")}
    broken = []
    for page in pages:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
            if "://" in target or target.startswith("mailto:") or target in settings:
                continue
            if not (page.parent / target).exists():
                broken.append(f"{page.relative_to(ROOT)} -> {target}")
    assert not broken, broken


def test_the_readme_evidence_table_is_the_bundles():
    table = evidence_index.readme_table(ROOT / "evidence")
    assert table in README, "README.md's evidence table is stale: python -m meshbench.results.index --readme evidence"


def test_the_cli_reference_is_generated_from_the_app():
    done = subprocess.run(
        [sys.executable, "-m", "typer", "meshbench.cli", "utils", "docs", "--name", "meshbench"],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    assert (ROOT / "docs" / "reference" / "cli.md").read_text().rstrip() == done.stdout.rstrip(), (
        "docs/reference/cli.md is stale: python -m typer meshbench.cli utils docs --name meshbench "
        "--output docs/reference/cli.md"
    )


def test_the_evidence_index_is_the_bundles():
    assert (ROOT / "evidence" / "INDEX.md").read_text() == evidence_index.render(ROOT / "evidence"), (
        "evidence/INDEX.md is stale: python -m meshbench.results.index evidence > evidence/INDEX.md"
    )


def test_readme_opens_with_the_two_setup_commands():
    block = README.split("```bash\n", 1)[1].split("```", 1)[0].splitlines()
    assert block[0] == "pip install -e . && meshbench sweep"
    flags = "-DGGML_RPC=on -DLLAVA_BUILD=off"
    assert block[1].startswith(f"CMAKE_ARGS=\"{flags}\" pip install -e '.[gguf,dev,server]' && python -m pytest")
    ci = (ROOT / ".ci" / "run").read_text()
    assert flags in ci  # CI installs the way a reader does
    assert " -n auto --dist worksteal" in block[1]  # the whole suite, on every core (pytest-xdist, in the dev extra)


@pytest.mark.parametrize("bundle", BUNDLES, ids=[b.name for b in BUNDLES])
def test_readme_table_equals_the_committed_bundle(bundle):
    data = json.loads((bundle / "results.json").read_text())
    marker = f"--out evidence/{bundle.name}\n"
    text = README + "\n" + DOCS
    assert marker in text, f"README.md and docs/ do not show how evidence/{bundle.name} was made"
    section = text.split(marker, 1)[1]
    if settings_matrix.is_matrix(data):  # a matrix of server settings: its table, from its settings' bundles
        rows = matrix_report.table_rows(
            settings_matrix.settings(
                bundle, serial.matrix_document(data), lambda p: json.loads((p / "results.json").read_text())
            )
        )
        # (a guide links each setting's README from where it sits: ../../evidence/MATRIX/FOLDER/README.md)
        shown = [[cell.replace(f"../../evidence/{bundle.name}/", "") for cell in row]
                 for row in report.parse_table(section, matrix_report.HEADER)]  # fmt: skip
        assert shown == rows
        assert data["command"].split("--out")[0].strip() in text
        return
    if data.get("kind") == "hunt":  # a hunt: no table; its command, as it ran, stands in the docs
        assert data["command"].split("--out")[0].strip() in text
        return
    typed = kinds.typed_results(data)
    if kinds.of(data) == kinds.ENDPOINT:  # a served model: its own table
        assert report.parse_table(section, endpoint_report.TABLE_HEADER) == endpoint_report.table_rows(typed)
        assert data["command"].split("--out")[0].strip() in text
        return
    rows = report.parse_table(section)
    assert rows == report.table_rows(typed)
    assert data["command"].split("--out")[0].strip() in text
    matrix = fault_report.table_rows(typed)
    if matrix:  # a fault bundle: its matrix is in the README too, cell for cell
        assert report.parse_table(section, fault_report.TABLE_HEADER) == matrix
