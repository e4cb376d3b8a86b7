"""A hunt bundle forged for verify: copied, its results.json edited, and its README and finding-K.json files
rendered again from the edit where the renderer can read it, so that only verify's checks of results.json itself
stand between the forgery and a pass (tests/test_hunt_forgeries.py on the node, tests/test_hunt_live.py on a
llama-server)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, Callable

from typer.testing import CliRunner

from meshbench.cli import app
from meshbench.errors import MeshbenchError
from meshbench.records import serial
from meshbench.results import hunt_report

runner = CliRunner()


def forged(bundle: Path, tmp_path: Path, edit: Callable[[dict[str, Any]], object]) -> tuple[int, str]:
    """``meshbench verify`` on a copy of ``bundle`` whose results.json ``edit`` changed: its exit code and output."""
    b = tmp_path / "H"
    shutil.copytree(bundle, b)
    doc = json.loads((b / "results.json").read_text())
    edit(doc)
    (b / "results.json").write_text(json.dumps(doc))
    try:  # (a forgery the renderer cannot read, not even typed: verify says so itself)
        for name, text in hunt_report.rendered_files(serial.hunt_document(doc), "H").items():
            (b / name).write_text(text)
    except MeshbenchError:
        pass
    r = runner.invoke(app, ["verify", str(b)])
    return r.exit_code, r.output
