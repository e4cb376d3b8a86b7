"""A sweep's records go from the runner to the bundle, the summary and the evidence check as built, never through
JSON within the process (issue 59): so what it built has to be what its results.json reads back as, field for field
and of the same types, or the README it renders from the one would not be the README verify renders from the other."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from meshbench.records import serial
from meshbench.results import document, kinds
from meshbench.sweep import run
from meshbench.workload import config

ROOT = Path(__file__).resolve().parents[1]


def _read_back(record):
    back = serial.node_results(json.loads(document.dumps(serial.to_json(record))))
    _same_types(record, back, "results")
    return back


def _same_types(a, b, at):
    """Equal is not enough: a str enum equals its value, True equals 1, numpy's float64 equals a float, and each
    renders otherwise in a README."""
    assert type(a) is type(b), f"{at}: {type(a).__name__} as built, {type(b).__name__} read back"
    if dataclasses.is_dataclass(a):
        for f in dataclasses.fields(a):
            _same_types(getattr(a, f.name), getattr(b, f.name), f"{at}.{f.name}")
    elif isinstance(a, (list, tuple)):
        for i, (x, y) in enumerate(zip(a, b)):
            _same_types(x, y, f"{at}[{i}]")
    elif isinstance(a, dict):
        for (k, x), (m, y) in zip(a.items(), b.items()):
            _same_types(k, m, f"{at} key {k!r}")
            _same_types(x, y, f"{at}[{k!r}]")


def test_the_default_sweeps_records_are_what_its_results_json_reads_back_as():
    record = run.sweep_on_node(config.load(None, {}), "meshbench sweep")
    back = _read_back(record)
    assert record == back
    bundled = kinds.KINDS[kinds.NODE].bundled(record)
    assert bundled == kinds.typed_results(serial.to_json(record))
    assert kinds.KINDS[kinds.NODE].readme(bundled, "B") == kinds.readme(serial.to_json(record), "B")


# each a sweep that builds records the default does not: faults and losses, a prefix cache's, conversations'
# turns, arrivals over time with a bounded queue's refusals; each config cut to what still builds those records (a
# level or two, fewer repetitions, rates), so the test costs seconds, not the bundle's minute
SMALLER = {
    "faults": {"levels": [2], "repeat": 1},
    "shared-prefix": {"levels": [4], "workload": {"new_tokens": 4}},
    # (a KV budget of 224 positions: turns are still evicted and prefilled again with 4-token answers)
    "conversations": {"levels": [2], "workload": {"new_tokens": 4}, "budget": {"kv_bytes": 344064}},
    "backpressure": {"rates": [0.2, 2.0], "workload": {"sessions": 12}},
}


# what each cut must still build, or the test would check less than it says
BUILDS = {
    "faults": lambda lvs: any(lv.fault_events for lv in lvs) and any(lv.engine_losses for lv in lvs),
    "shared-prefix": lambda lvs: all(lv.prefix and lv.prefix.hits for lv in lvs),
    "conversations": lambda lvs: (
        any(lv.turn_events for lv in lvs) and any(lv.prefix and lv.prefix.conversation_misses for lv in lvs)
    ),
    "backpressure": lambda lvs: any(lv.rejected_admissions for lv in lvs),
}


@pytest.mark.parametrize("name", sorted(SMALLER))
def test_other_sweeps_records_are_what_their_results_json_reads_back_as(name):
    cfg = config.load(ROOT / "configs" / f"{name}.yaml", SMALLER[name])
    record = run.sweep_on_node(cfg, f"meshbench sweep --config configs/{name}.yaml")
    assert record == _read_back(record)
    assert BUILDS[name](record.levels), f"the cut {name} config no longer builds what it is here for"
