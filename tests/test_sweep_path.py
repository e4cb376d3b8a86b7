"""A sweep's records go from the runner to the bundle, the summary and the evidence check as built, never through
JSON within the process (issue 59): so what it built has to be what its results.json reads back as, field for field
and of the same types, or the README it renders from the one would not be the README verify renders from the other."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from meshbench.records import serial
from meshbench.results import document, kinds
from meshbench.sweep import run
from meshbench.workload import config

ROOT = Path(__file__).resolve().parents[1]


def _read_back(record):
    return serial.node_results(json.loads(document.dumps(serial.to_json(record))))


def test_the_default_sweeps_records_are_what_its_results_json_reads_back_as():
    record = run.sweep_on_node(config.load(None, {}), "meshbench sweep")
    back = _read_back(record)
    assert record == back
    bundled = kinds.KINDS[kinds.NODE].bundled(record)
    assert bundled == kinds.typed_results(serial.to_json(record))
    assert kinds.KINDS[kinds.NODE].readme(bundled, "B") == kinds.readme(serial.to_json(record), "B")


# each a sweep that builds records the default does not: faults and losses, a prefix cache's, conversations'
# turns, arrivals over time with a bounded queue's refusals
@pytest.mark.slow
@pytest.mark.parametrize("name", ["faults", "shared-prefix", "conversations", "backpressure"])
def test_other_sweeps_records_are_what_their_results_json_reads_back_as(name):
    cfg = config.load(ROOT / "configs" / f"{name}.yaml", {})
    record = run.sweep_on_node(cfg, f"meshbench sweep --config configs/{name}.yaml")
    assert record == _read_back(record)
