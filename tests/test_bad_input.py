"""Bad input: one clear line naming the problem, exit code 2, no traceback, nothing written."""

import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from meshbench.cli import app

runner = CliRunner()


def run_refused(*args, expect: str, cwd_files: Path | None = None):
    before = sorted(p.name for p in cwd_files.iterdir()) if cwd_files else None
    r = runner.invoke(app, [str(a) for a in args])
    assert r.exit_code == 2, (args, r.exit_code, r.output)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, f"expected one line, got: {r.stderr!r}"
    assert lines[0].startswith("error: ") and expect in lines[0], lines[0]
    assert "Traceback" not in r.output
    assert r.stdout == ""
    if cwd_files is not None:
        assert sorted(p.name for p in cwd_files.iterdir()) == before, "something was written"
    return lines[0]


CONFIGS = {
    "not-yaml": ("levels: [1, 2\nengine: {", "not valid YAML"),
    "not-a-mapping": ("- 1\n- 2\n", "expected a mapping"),
    "unknown-key": ("budget: {kv_bytez: 10}\n", "budget: unknown key ('kv_bytez' was unexpected)"),
    "unknown-top-key": ("levles: [1]\n", "unknown key ('levles'"),
    "wrong-type": ("workload: {sessions: eight}\n", "workload.sessions: 'eight' is not of type 'integer'"),
    "null-budget": ("budget: {kv_bytes: null}\n", "budget.kv_bytes: None is not of type 'integer'"),
    "missing-required": ("engine: {kind: gguf}\n", "engine.kind gguf needs engine.model"),
    "negative-budget": ("budget: {scratch_bytes: -5}\n", "budget.scratch_bytes: -5 is less than the minimum of 1"),
    "zero-budget": ("budget: {max_prefill_tokens_per_tick: 0}\n", "budget.max_prefill_tokens_per_tick: 0"),
    "kv-cannot-hold-one": ("budget: {kv_bytes: 10000}\n", "budget.kv_bytes 10000 cannot hold a single session"),
    "scratch-cannot-hold-one": ("budget: {scratch_bytes: 100}\n", "budget.scratch_bytes 100 cannot hold"),
    "batch-over-slots": ("budget: {max_batch_size: 9}\n", "max_batch_size 9 exceeds max_active_sessions 8"),
    "level-over-sessions": ("levels: [1, 16]\n", "level 16 exceeds the 8 sessions"),
    "list-length": ("workload: {sessions: 3, new_tokens: [1, 2]}\n", "new_tokens has 2 entries for 3 sessions"),
    "bad-engine": ("engine: {kind: tensorrt}\n", "engine.kind: 'tensorrt' is not one of"),
}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_bad_config_files(tmp_path, name):
    text, expect = CONFIGS[name]
    cfg = tmp_path / "c.yaml"
    cfg.write_text(text)
    out = tmp_path / "bundle"
    run_refused("sweep", "--config", cfg, "--out", out, expect=expect, cwd_files=tmp_path)


def test_a_config_that_is_a_directory_or_missing(tmp_path):
    run_refused("sweep", "--config", tmp_path, expect="is a directory")
    run_refused("sweep", "--config", tmp_path / "none.yaml", expect="no such file")


FLAGS = {
    "levels-zero": (["--levels", "0"], "--levels: 0 is below the minimum 1"),
    "levels-negative": (["--levels", "-1"], "--levels: -1 is below the minimum 1"),
    "levels-letter": (["--levels", "a"], "--levels: 'a' is not an integer"),
    "levels-empty-entry": (["--levels", "1,,2"], "--levels: empty entry in '1,,2'"),
    "levels-empty": (["--levels", ""], "--levels: empty"),
    "levels-above-sessions": (["--levels", "1,2,4,16"], "level 16 exceeds the 8 sessions"),
    "levels-duplicate": (["--levels", "1,2,2"], "--levels: 2 appears twice"),
    "prompt-list-length": (["--prompt-tokens", "4,4,4"], "prompt_tokens has 3 entries for 8 sessions"),
    "new-list-length": (["--sessions", "2", "--new-tokens", "1,2,3"], "new_tokens has 3 entries for 2 sessions"),
    "prompt-too-long": (["--prompt-tokens", "600"], "context length is 512"),
    "prompt-zero": (["--prompt-tokens", "0"], "--prompt-tokens: 0 is below the minimum 1"),
    "unknown-engine": (["--engine", "tpu"], "engine.kind: 'tpu' is not one of"),
    "unknown-preset": (["--preset", "huge"], "unknown preset 'huge'"),
    "unknown-device": (["--device", "tpu"], "engine.device: 'tpu' is not one of"),
    "synthetic-on-cuda": (["--device", "cuda"], "synthetic runs on the CPU only"),
    "threads-not-int": (["--threads", "two"], "Invalid value for '--threads'"),
    "unknown-flag": (["--levelz", "1"], "No such option: --levelz"),
    "gguf-without-model": (["--engine", "gguf"], "engine.kind gguf needs engine.model"),
    "synthetic-missing-model": (["--model", "nope.gguf"], "model nope.gguf: no such file"),
}


@pytest.mark.parametrize("name", sorted(FLAGS))
def test_bad_flags(tmp_path, name):
    args, expect = FLAGS[name]
    run_refused("sweep", *args, "--out", tmp_path / "b", expect=expect, cwd_files=tmp_path)


def test_out_naming_an_existing_file(tmp_path):
    f = tmp_path / "results"
    f.write_text("keep me")
    run_refused("sweep", "--out", f, expect="exists and is not a directory", cwd_files=tmp_path)
    assert f.read_text() == "keep me"


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores directory permissions")
def test_out_in_an_unwritable_directory_as_a_user(tmp_path):
    d = tmp_path / "ro"
    d.mkdir()
    d.chmod(0o500)
    try:
        run_refused("sweep", "--out", d / "b", expect="is not writable")
    finally:
        d.chmod(0o700)


def test_out_in_an_unwritable_directory(tmp_path, monkeypatch):
    # Also as root (CI): the check asks os.access, so deny it there.
    import meshbench.results.bundle as bundle

    d = tmp_path / "ro"
    d.mkdir()
    real = os.access
    monkeypatch.setattr(bundle.os, "access", lambda p, m: False if Path(p) == d.resolve() else real(p, m))
    run_refused("sweep", "--out", d / "b", expect="is not writable", cwd_files=d)


def test_out_under_a_missing_parent(tmp_path):
    run_refused("sweep", "--out", tmp_path / "no" / "b", expect="does not exist", cwd_files=tmp_path)


def test_existing_bundle_without_force(tmp_path):
    out = tmp_path / "b"
    assert runner.invoke(app, ["sweep", "--levels", "1", "--out", str(out)]).exit_code == 0
    before = (out / "results.json").read_bytes()
    run_refused("sweep", "--out", out, expect="pass --force")
    assert (out / "results.json").read_bytes() == before


def test_admit_and_make_tiny_refuse_bad_input(tmp_path):
    run_refused("admit", "--kv-bytes", "0", expect="Invalid value for '--kv-bytes'")
    run_refused("admit", "--max-batch-size", "9", expect="max_batch_size 9 exceeds max_active_sessions 8")
    run_refused("model", "make-tiny", tmp_path / "m.gguf", "--type", "q2_k", expect="--type must be one of")
    run_refused("model", "make-tiny", tmp_path / "m.gguf", "--preset", "huge", expect="unknown preset")
    run_refused("model", "make-tiny", tmp_path / "x" / "m.gguf", expect="does not exist")
    (tmp_path / "m.gguf").write_text("x")
    run_refused("model", "make-tiny", tmp_path / "m.gguf", expect="exists; pass --force")
