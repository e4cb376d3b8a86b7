"""verify --rerun across machines: exact records everywhere, floats bit for bit on the recording fingerprint
and within the stated tolerance on another, and the outcome says which case it was."""

from __future__ import annotations

import copy
import dataclasses
import json
import math

import factories
import pytest
from typer.testing import CliRunner

from meshbench.analysis.checks import Checks
from meshbench.cli import app
from meshbench.results import fingerprint
from meshbench.sweep import run
from meshbench.verify import bundle as verify
from meshbench.verify import reproduce

runner = CliRunner()


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("reproduce") / "b"
    r = runner.invoke(app, ["sweep", "--levels", "1,2", "--out", str(out)])
    assert r.exit_code == 0, r.output
    return json.loads((out / "results.json").read_text())


def _elsewhere(data: dict) -> dict:
    """The same records, as if written on another machine (an AMD CPU with another BLAS kernel)."""
    fp = dict(data["environment"]["compute"], cpu="AMD EPYC 9B14", blas={"library": "openblas", "version": "0.3.30",
              "kernel": "Zen", "threads": 2})  # fmt: skip
    data["environment"]["compute"] = factories.compute_digest(fp)
    return data


def _shift_margins(data: dict, ulps: int = 1) -> None:
    for lv in data["levels"]:
        for s in lv["sessions"]:
            s["margins"] = [m if m is None else _ulp(m, ulps) for m in s["margins"]]


def _ulp(x: float, n: int) -> float:
    for _ in range(n):
        x = math.nextafter(x, math.inf)
    return x


def _check(data: dict) -> tuple[Checks, reproduce.Outcome]:
    c = Checks()
    outcome = reproduce.check_rerun(c, data, run.rerun_results)
    return c, outcome


def test_the_fingerprint_names_the_kernels_and_its_digest_covers_them():
    fp = fingerprint.fingerprint()
    assert fp.digest == fingerprint.digest(fp)
    assert fp.cpu and isinstance(fp.simd, list)
    assert fp.blas is None or fp.blas.library
    assert fingerprint.digest(dataclasses.replace(fp, simd=[*fp.simd, "avx512f_forged"])) != fp.digest
    assert fingerprint.simd_flags("processor: 0\nflags\t: fpu sse4_2 avx2 fma ht avx512f\n") == [
        "avx2",
        "avx512f",
        "fma",
        "sse4_2",
    ]


def test_a_rerun_on_the_recording_fingerprint_is_bit_for_bit(recorded):
    c, outcome = _check(copy.deepcopy(recorded))
    assert c.failures == []
    assert outcome.same_fingerprint and outcome.unequal_bits == 0
    assert str(outcome).startswith("reproduced here bit for bit")


def test_one_ulp_on_another_fingerprint_passes_with_the_deviation_reported(recorded):
    data = _elsewhere(copy.deepcopy(recorded))
    _shift_margins(data)
    c, outcome = _check(data)
    assert c.failures == [], [str(f) for f in c.failures]
    assert not outcome.same_fingerprint and outcome.unequal_bits > 0
    assert 0 < outcome.deviation < 1e-14, outcome.deviation
    assert "floats within" in str(outcome) and "recorded on AMD EPYC 9B14 (BLAS kernel Zen)" in str(outcome)


def test_one_ulp_on_the_recording_fingerprint_fails(recorded):
    data = copy.deepcopy(recorded)
    _shift_margins(data)
    c, _ = _check(data)
    assert c.failures and all("bit for bit on the recording fingerprint" in f.field for f in c.failures)


def test_a_margins_forgery_beyond_the_tolerance_fails_on_another_fingerprint(recorded):
    data = _elsewhere(copy.deepcopy(recorded))
    s = data["levels"][1]["sessions"][0]
    s["margins"][3] += 1e-6  # 1000x the float64 tolerance, far below any token flip
    c, _ = _check(data)
    assert [f.field for f in c.failures] == ["levels[1].sessions[0].margins"]
    assert "off by 1e-06" in str(c.failures[0])


def test_one_token_changed_fails_naming_session_token_and_margin(recorded):
    data = _elsewhere(copy.deepcopy(recorded))
    s = data["levels"][0]["sessions"][2]
    s["tokens"][5] = (s["tokens"][5] + 1) % 256
    c, _ = _check(data)
    msgs = [str(f) for f in c.failures if "sessions[2]" in f.field]
    assert len(msgs) == 1, [str(f) for f in c.failures]
    assert f"({s['session_id']})" in msgs[0] and "token 5" in msgs[0]
    assert f"recorded margin {s['margins'][5]}" in msgs[0] and "does not reproduce on this hardware" in msgs[0]


def test_isolation_margin_digests_are_left_to_the_rerun_on_another_fingerprint(recorded):
    data = _elsewhere(copy.deepcopy(recorded))
    for p in data["levels"][1]["isolation"]["passes"]:
        for s in p["sessions"]:
            s["margins_digest"] = "0" * 64
    c, outcome = _check(data)
    # the recorded bundle is no longer self-consistent (plain verify's job); the rerun compares what it can
    assert c.failures == [], [str(f) for f in c.failures]
    assert outcome.digests_skipped > 0 and "isolation verdict compared its passes bit for bit" in str(outcome)
    same = copy.deepcopy(recorded)
    same["levels"][1]["isolation"]["passes"][0]["sessions"][0]["margins_digest"] = "0" * 64
    c, _ = _check(same)
    assert [f.field for f in c.failures] == ["levels[1].isolation.passes[0].sessions[0].margins_digest"]


def test_verify_rerun_prints_the_outcome(tmp_path):
    out = tmp_path / "b"
    assert runner.invoke(app, ["sweep", "--levels", "1,2", "--out", str(out)]).exit_code == 0
    r = runner.invoke(app, ["verify", str(out), "--rerun"])
    assert r.exit_code == 0, r.output
    here = fingerprint.describe(fingerprint.fingerprint())
    assert f"{out}: reproduced here bit for bit (recorded on {here}" in r.output.replace("\n", "")


def test_a_bundle_without_a_fingerprint_fails_the_schema_in_one_line(recorded, tmp_path):
    from meshbench.results import kinds

    older = copy.deepcopy(recorded)
    del older["environment"]["compute"]  # (schema 4 requires it: a rerun trusts it to say how floats compare)
    assert kinds.schema_errors(older) == ["environment: 'compute' is a required property"]


def test_plain_verify_checks_the_fingerprint_digest(recorded):
    data = copy.deepcopy(recorded)
    data["environment"]["compute"]["cpu"] = "Forged CPU"
    assert [f.field for f in verify.check_data(data).failures] == ["environment.compute.digest"]


def test_the_fingerprint_names_numpys_blas_whatever_was_loaded_first():
    import subprocess
    import sys

    code = "from meshbench.results import fingerprint; print(fingerprint.fingerprint().digest)"
    plain = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    scipy_first = subprocess.run(
        [sys.executable, "-c", "import scipy.linalg; " + code], capture_output=True, text=True, check=True
    ).stdout
    assert plain == scipy_first


def test_the_smallest_margin_names_the_token_most_likely_to_flip_elsewhere(recorded):
    from meshbench.analysis import figures
    from meshbench.records import serial
    from meshbench.records.model import LevelRecord
    from meshbench.results import kinds

    levels = copy.deepcopy(recorded["levels"])
    levels[1]["sessions"][3]["margins"][2] = 1e-7
    levels[0]["sessions"][0]["margins"][0] = None  # a non-finite margin is not a near-tie
    low = figures.smallest_margin([serial.from_json(lv, LevelRecord) for lv in levels])
    assert low == figures.Margin(1e-7, "s3", 2, levels[1]["concurrency"])
    text = kinds.readme(dict(recorded, levels=levels), "B")
    assert "smallest top-1 minus top-2 margin: 1e-07 (session s3 token 2 at level 2): a near-tie (below 1e-06" in text
    engine = serial.node_results(recorded).engine
    assert engine.kind == "synthetic" and figures.near_tie(engine) == 1e-6
    assert figures.near_tie(dataclasses.replace(engine, kind="gguf")) == 0.05
    far = copy.deepcopy(recorded["levels"])
    for lv in far:
        for s in lv["sessions"]:
            s["margins"] = [0.5 for _ in s["margins"]]
    assert "no near-tie" in kinds.readme(dict(recorded, levels=far), "B")
