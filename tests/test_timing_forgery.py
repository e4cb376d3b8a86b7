"""Fabricated timing fails plain verify: stamps before the ticks that made their tokens, and repetitions that are
copies of one another with a few ns of jitter (probe 4, finding 9). Real runs pass the same checks."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import factories as f
import pytest
from typer.testing import CliRunner

from meshbench.cli import app
from meshbench.verify import bundle as verify

runner = CliRunner()


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("t") / "b"
    r = runner.invoke(app, ["sweep", "--levels", "1,4", "--repeat", "3", "--isolation-rounds", "1", "--out", str(out)])
    assert r.exit_code == 0, r.output
    return json.loads(Path(out / "results.json").read_text())


def _failures(d: dict) -> list[str]:
    return [str(f) for f in verify.check_data(d).failures]


def test_real_repetitions_pass(data):
    assert _failures(data) == []


def test_tokens_stamped_at_admission_fail(data):
    d = copy.deepcopy(data)
    rep = d["levels"][1]["repetitions"][0]
    for s in rep["sessions"]:
        s["token_ns"] = [s["admit_ns"] + 1] * len(s["token_ns"])  # TTFT and E2E of 0.00 ms
    f.recompute_wall(d["levels"][1])  # a careful forger
    bad = _failures(d)
    assert any("token stamps (none before the ticks that preceded it)" in f for f in bad), bad


def test_a_repetition_copied_with_jitter_fails(data):
    d = copy.deepcopy(data)
    reps = d["levels"][0]["repetitions"]
    forged = copy.deepcopy(reps[0])
    forged.update(repetition=2, position=reps[2]["position"])
    for k, t in enumerate(forged["tick_records"]):
        t["tick_ns"] += 3 + k % 4
    for s in forged["sessions"]:
        s["token_ns"] = [x + 5 for x in s["token_ns"]]
    reps[2] = forged
    bad = _failures(d)
    assert any("a copy, not a run" in f and "[0, 2]" in f for f in bad), bad


def test_a_copy_with_one_stamp_moved_is_still_a_copy(data):
    d = copy.deepcopy(data)
    reps = d["levels"][1]["repetitions"]
    for i in (1, 2):
        forged = copy.deepcopy(reps[0])
        forged.update(repetition=i, position=reps[i]["position"])
        forged["sessions"][0]["token_ns"][-1] += 1001 * i
        reps[i] = forged
    bad = _failures(d)
    assert any("a copy, not a run" in f for f in bad), bad
