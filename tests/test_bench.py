"""Benchmark commands run and report their fields. Nothing here is timed or compared to a target."""

import json

import pytest
from typer.testing import CliRunner

from meshbench.cli import app

runner = CliRunner()


def _json(*args):
    r = runner.invoke(app, [str(a) for a in args])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def test_bench_engine_reports_every_field():
    d = _json("bench", "engine", "--preset", "dgr-012", "--batches", "1,2,4", "--repeats", "2", "--context", "8",
              "--json")
    assert d["bandwidth_gb_s"] > 0 and d["peak_gflop_s"] > 0
    assert [b["batch"] for b in d["batches"]] == [1, 2, 4]
    for b in d["batches"]:
        assert {"batch", "step_ms", "tokens_per_s", "loop_step_ms", "floor_ms"} <= set(b)
        assert b["step_ms"] > 0 and b["floor_ms"] > 0
        assert b["step_over_floor"] == pytest.approx(b["step_ms"] / b["floor_ms"])


def test_bench_layouts_reports_each_layout():
    d = _json("bench", "layouts", "--batches", "1,2", "--json")
    assert [b["batch"] for b in d["batches"]] == [1, 2]
    assert set(d["batches"][0]["ms"]) == {"x @ w.T", "w @ x.T (contiguous)", "4 row blocks", "einsum",
                                          "meshbench linear()"}


def test_bench_gguf_and_invariance(tmp_path):
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not importable")
    m = tmp_path / "t.gguf"
    assert runner.invoke(app, ["model", "make-tiny", str(m), "--type", "q8_0"]).exit_code == 0
    d = _json("bench", "gguf", "--model", m, "--batches", "1,2", "--steps", "4", "--threads", "2", "--json")
    for b in d["batches"]:
        assert b["ratio"] == pytest.approx(b["raw_step_ms"] / b["scheduler_step_ms"])
        assert b["samples"] == 8  # two rounds of four steps
    inv = _json("bench", "invariance", "--model", m, "--threads", "2", "--steps", "4", "--json")
    default = next(c for c in inv["configs"] if c["config"] == "default")
    assert default["bitwise_identical"] and default["tokens_identical"]


def test_bench_tables_print_without_json():
    r = runner.invoke(app, ["bench", "layouts", "--batches", "1"])
    assert r.exit_code == 0, r.output
    assert "meshbench linear()" in r.stdout and "ms per pass" in r.stdout
    r = runner.invoke(app, ["bench", "engine", "--preset", "dgr-012", "--batches", "1,2", "--repeats", "1",
                            "--context", "4"])
    assert r.exit_code == 0, r.output
    assert "step/floor" in r.stdout
