"""README.md stays current: its evidence tables equal the committed bundles, its commands exist."""

import json
from pathlib import Path

import pytest

from meshbench import fault_report, report

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
BUNDLES = sorted(p for p in (ROOT / "evidence").iterdir() if (p / "results.json").is_file())


def test_readme_opens_with_the_two_setup_commands():
    block = README.split("```bash\n", 1)[1].split("```", 1)[0].splitlines()
    assert block[0] == "pip install -e . && meshbench sweep"
    flags = "-DGGML_RPC=on -DLLAVA_BUILD=off"
    assert block[1].startswith(f"CMAKE_ARGS=\"{flags}\" pip install -e '.[gguf,dev]' && python -m pytest")
    ci = (ROOT / ".ci" / "run").read_text()
    assert flags in ci  # CI installs the way a reader does


@pytest.mark.parametrize("bundle", BUNDLES, ids=[b.name for b in BUNDLES])
def test_readme_table_equals_the_committed_bundle(bundle):
    data = json.loads((bundle / "results.json").read_text())
    marker = f"--out evidence/{bundle.name}\n"
    assert marker in README, f"README.md does not show how evidence/{bundle.name} was made"
    section = README.split(marker, 1)[1]
    rows = report.parse_table(section)
    assert rows == report.table_rows(data)
    assert data["command"].split("--out")[0].strip() in README
    matrix = fault_report.table_rows(data)
    if matrix:  # a fault bundle: its matrix is in the README too, cell for cell
        assert report.parse_table(section, fault_report.TABLE_HEADER) == matrix
