"""Endpoint bundles of the older schema (3): read only where evidence/OLDER.json pins their results.json by
digest (verify --older), under their own rules; any other schema-3 bundle is refused, so a schema-4 bundle stripped
to look older cannot be judged by the weaker rules."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from typer.testing import CliRunner

from meshbench import files
from meshbench.cli import app
from meshbench.verify import pins

ROOT = Path(__file__).resolve().parents[1]
OLDER = ROOT / "evidence" / "OLDER.json"
runner = CliRunner()


def test_the_pins_are_exactly_the_committed_schema_3_endpoint_bundles():
    pinned = json.loads(OLDER.read_text())[pins.KEY]
    older = {
        str(p.relative_to(ROOT)): files.sha256(p)
        for p in (ROOT / "evidence").glob("**/results.json")
        if json.loads(p.read_text()).get("kind") == "endpoint" and json.loads(p.read_text())["schema_version"] == 3
    }
    assert pinned == older


def _a_pinned_setting(tmp_path) -> Path:
    rel = sorted(json.loads(OLDER.read_text())[pins.KEY])[0]
    src = (ROOT / rel).parent
    b = tmp_path / src.name
    shutil.copytree(src, b)
    return b


def test_a_pinned_schema_3_bundle_verifies_with_older_and_is_refused_without(tmp_path):
    b = _a_pinned_setting(tmp_path)
    r = runner.invoke(app, ["verify", str(b)])
    assert r.exit_code == 2 and "a bundle of 3 is read only where verify --older pins its digest" in r.output
    r = runner.invoke(app, ["verify", str(b), "--older", str(OLDER)])
    assert r.exit_code == 0 and "a pinned schema-3 bundle" in r.output, r.output


def test_a_schema_3_bundle_changed_by_one_byte_is_no_longer_pinned(tmp_path):
    b = _a_pinned_setting(tmp_path)
    rj = b / "results.json"
    rj.write_text(rj.read_text().replace('"seed": 0', '"seed": 0 ', 1) + "\n")
    r = runner.invoke(app, ["verify", str(b), "--older", str(OLDER)])
    assert r.exit_code == 2 and "schema_version 3" in r.output


def test_a_bad_pin_file_is_one_line(tmp_path):
    b = _a_pinned_setting(tmp_path)
    bad = tmp_path / "older.json"
    bad.write_text('{"endpoint_schema_3": {"x": "not a digest"}}')
    r = runner.invoke(app, ["verify", str(b), "--older", str(bad)])
    assert r.exit_code == 2 and "--older" in r.output and "sha256" in r.output and "Traceback" not in r.output
