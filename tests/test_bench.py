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
    d = _json(
        "bench", "engine", "--preset", "dgr-012", "--batches", "1,2,4", "--repeats", "2", "--context", "8", "--json"
    )
    assert d["bandwidth_gb_s"] > 0 and d["peak_gflop_s"] > 0
    assert [b["batch"] for b in d["batches"]] == [1, 2, 4]
    for b in d["batches"]:
        assert {"batch", "step_ms", "tokens_per_s", "loop_step_ms", "floor_ms"} <= set(b)
        assert b["step_ms"] > 0 and b["floor_ms"] > 0
        assert b["step_over_floor"] == pytest.approx(b["step_ms"] / b["floor_ms"])


def test_bench_layouts_reports_each_layout():
    d = _json("bench", "layouts", "--batches", "1,2", "--weights", "4", "--shape", "256,128", "--json")
    assert [b["batch"] for b in d["batches"]] == [1, 2]
    assert (d["weights"], d["shape"], d["bytes"]) == (4, [256, 128], 4 * 256 * 128 * 4)
    assert set(d["batches"][0]["ms"]) == {
        "x @ w.T",
        "w @ x.T (contiguous)",
        "4 row blocks",
        "einsum",
        "meshbench linear()",
    }


def test_bench_scheduler_reports_each_size():
    d = _json("bench", "scheduler", "--live", "8,32", "--batch", "4", "--ticks", "5", "--rounds", "2", "--json")
    assert [r["live"] for r in d["sizes"]] == [8, 32]
    assert all(r["samples"] == 10 and r["ms_per_tick_median"] > 0 for r in d["sizes"])
    assert d["sizes"][0]["vs_first"] == 1.0
    r = runner.invoke(app, ["bench", "scheduler", "--live", "2", "--batch", "4"])
    assert r.exit_code == 2 and "fewer live sessions than the batch of 4" in r.stderr


def test_bench_gguf_and_invariance(tmp_path):
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not importable")
    m = tmp_path / "t.gguf"
    assert runner.invoke(app, ["model", "make-tiny", str(m), "--type", "q8_0"]).exit_code == 0
    d = _json("bench", "gguf", "--model", m, "--batches", "1,2", "--steps", "4", "--threads", "2", "--json")
    for b in d["batches"]:
        assert b["ratio"] == pytest.approx(b["raw_step_ms"] / b["scheduler_step_ms"])
        assert b["samples"] == 8  # two rounds of four steps
    inv = _json("bench", "invariance", "--model", m, "--threads", "2", "--steps", "3", "--batches", "1,2,8", "--json")
    default = next(
        r["measured"]
        for r in inv["recipes"]
        if not r["repack"] and r["tiled_mm"] == "auto" and r["context"] == "default"
    )
    assert all(r["error"] is None for r in inv["recipes"])
    assert default["largest_invariant_batch"] == 8 and default["first_variant_batch"] is None  # Q8_0: no tiled path
    assert [b["batch"] for b in default["per_batch"]] == [1, 2, 8]
    assert all(b["bitwise"] and b["tokens_identical"] for b in default["per_batch"])
    assert set(default["decode_tokens_per_s"]) == {"1", "8"}
    assert len(inv["recipes"]) == 10  # 4 contexts x repack off/on, and the tiled switch off and forced
    r = runner.invoke(app, ["bench", "invariance", "--model", str(m), "--batches", "2,4"])
    assert r.exit_code == 2 and "must ascend from 1" in r.stderr


def test_bench_tables_print_without_json():
    r = runner.invoke(app, ["bench", "layouts", "--batches", "1", "--weights", "2", "--shape", "128,64"])
    assert r.exit_code == 0, r.output
    assert "meshbench linear()" in r.stdout and "ms per pass" in r.stdout
    r = runner.invoke(app, ["bench", "scheduler", "--live", "8,32", "--batch", "4", "--ticks", "3", "--rounds", "2"])
    assert r.exit_code == 0, r.output
    assert "ms/tick" in r.stdout
    r = runner.invoke(
        app, ["bench", "engine", "--preset", "dgr-012", "--batches", "1,2", "--repeats", "1", "--context", "4"]
    )
    assert r.exit_code == 0, r.output
    assert "step/floor" in r.stdout


def test_bench_breakdown_accounts_for_every_part_of_a_tick(tmp_path):
    pytest.importorskip("llama_cpp")
    import factories as f

    model = f.tiny_gguf(tmp_path / "m.gguf", "q8_0")
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        f"engine: {{kind: gguf, model: {model}, threads: 1}}\nworkload: {{sessions: 4, prompt_tokens: 8, "
        "new_tokens: 6}\nbudget: {max_prefill_tokens_per_tick: 16}\n"
    )
    d = _json("bench", "breakdown", "--config", cfg, "--levels", "1,4", "--repeat", "2", "--json")
    assert [lv["concurrency"] for lv in d["levels"]] == [1, 4]
    for lv in d["levels"]:
        assert lv["ticks"] > 0 and lv["tokens_per_s"]["median"] > 0
        parts = ("decode_llama_ms", "prefill_llama_ms", "sample_ms", "engine_python_ms", "scheduler_ms")
        assert all(lv[k]["min"] >= 0 for k in parts)
        # the parts add up to the tick in every repetition, so their medians are close to the tick's
        assert sum(lv[k]["median"] for k in parts) == pytest.approx(lv["tick_ms"]["median"], rel=0.5)
    r = runner.invoke(app, ["bench", "breakdown", "--config", str(cfg), "--levels", "1", "--repeat", "1"])
    assert r.exit_code == 0 and "llama_decode" in r.output
