"""Hostile input: meshbench never destroys what it did not write, and a bundle never lies to verify.

Each test is one case of the adversarial pass (issue 9): a refusal with exit 2, one line
and nothing written; a verify failure with exit 1; or a clean stop.
"""

import json
import os
import select
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import factories as f
import numpy as np
import pytest
from test_bad_input import run_refused
from typer.testing import CliRunner

from meshbench import limits, validation
from meshbench.cli import app
from meshbench.engine.synthetic import SyntheticEngine
from meshbench.records import serial
from meshbench.results import chart
from meshbench.scheduler.session import DoneReason
from meshbench.sweep.levels import SweepPlan, run_concurrency_sweep
from meshbench.workload.config import Workload

runner = CliRunner()
CLI = [sys.executable, "-m", "meshbench.cli"]


def cli(*args):
    return runner.invoke(app, [str(a) for a in args])


@pytest.fixture(scope="module")
def good_bundle(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("good") / "b"
    r = cli("sweep", "--levels", "1,2", "--out", out)
    assert r.exit_code == 0, r.output
    return out


def copy_bundle(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def tamper(path: Path, edit) -> Path:
    data = json.loads((path / "results.json").read_text())
    edit(data)
    (path / "results.json").write_text(json.dumps(data, indent=1))
    return path


def tree(path: Path) -> dict:
    return {str(p.relative_to(path)): p.read_bytes() if p.is_file() else None for p in sorted(path.rglob("*"))}


# --- 1. --force replaces only a meshbench bundle ----------------------------------------
def test_force_never_deletes_a_folder_that_is_not_a_bundle(tmp_path):
    d = tmp_path / "d"
    (d / "sub").mkdir(parents=True)
    (d / "mine.txt").write_text("keep")
    before = tree(d)
    for extra in ([], ["--force"]):
        run_refused("sweep", "--out", d, *extra, expect="not a meshbench bundle (mine.txt, ...)")
        assert tree(d) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d"]  # no staging folder left


def test_force_refuses_a_bundle_holding_a_file_meshbench_did_not_write(tmp_path, good_bundle):
    b = copy_bundle(good_bundle, tmp_path / "b")
    (b / "notes.md").write_text("mine")
    run_refused("sweep", "--levels", "1", "--out", b, "--force", expect="also holds notes.md")
    assert (b / "notes.md").read_text() == "mine"


def test_force_replaces_a_real_bundle(tmp_path, good_bundle):
    b = copy_bundle(good_bundle, tmp_path / "b")
    run_refused("sweep", "--levels", "1", "--out", b, expect="a meshbench bundle already exists there")
    r = cli("sweep", "--levels", "1", "--out", b, "--force")
    assert r.exit_code == 0, r.output
    assert [lv["concurrency"] for lv in json.loads((b / "results.json").read_text())["levels"]] == [1]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b"]


def test_a_results_json_that_is_not_meshbench_s_is_not_a_bundle(tmp_path):
    d = tmp_path / "d"
    d.mkdir()
    (d / "results.json").write_text('{"somebody": "else"}')
    run_refused("sweep", "--out", d, "--force", expect="not a meshbench bundle")
    assert (d / "results.json").read_text() == '{"somebody": "else"}'


# --- 2. make-tiny --force replaces only a regular file ------------------------------------
@pytest.mark.parametrize("kind", ["fifo", "symlink", "device"])
def test_make_tiny_force_replaces_only_a_regular_file(tmp_path, kind):
    pytest.importorskip("gguf")
    target = tmp_path / "m.gguf"
    if kind == "fifo":
        os.mkfifo(target)
    elif kind == "symlink":
        (tmp_path / "real").write_text("keep")
        target.symlink_to(tmp_path / "real")
    else:
        target = Path("/dev/null")
    mode = target.lstat().st_mode
    run_refused("model", "make-tiny", target, "--force", expect="is not a regular file")
    assert target.lstat().st_mode == mode
    if kind == "symlink":
        assert (tmp_path / "real").read_text() == "keep"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".meshbench")]


def test_make_tiny_force_replaces_a_regular_file_with_the_umask(tmp_path):
    pytest.importorskip("gguf")
    target = tmp_path / "m.gguf"
    target.write_text("old")
    old = os.umask(0o022)
    try:
        assert cli("model", "make-tiny", target, "--force").exit_code == 0
    finally:
        os.umask(old)
    assert target.read_bytes()[:4] == b"GGUF"
    assert stat.S_IMODE(target.stat().st_mode) == 0o644


# --- 3. values that reach native code are bounded ----------------------------------------
def test_threads_beyond_llama_cpp_s_limit_are_refused(tmp_path):
    for n in ("100000", "99999999999"):
        run_refused(
            "sweep",
            "--engine",
            "gguf",
            "--model",
            "m.gguf",
            "--threads",
            n,
            expect="Invalid value for '--threads': Input should be less than or equal to 512",
        )
    cfg = tmp_path / "c.yaml"
    cfg.write_text("engine: {threads: 100000}\n")
    run_refused("sweep", "--config", cfg, expect="engine.threads: 100000 is greater than the maximum of 512")


def test_limits_in_the_schema_match_the_code():
    s = validation.load("config.schema.json")
    p = s["properties"]
    assert p["engine"]["properties"]["threads"]["maximum"] == limits.MAX_THREADS
    assert p["workload"]["properties"]["sessions"]["maximum"] == limits.MAX_SESSIONS
    assert p["levels"]["maxItems"] == limits.MAX_LEVELS
    assert s["$defs"]["per_session"]["oneOf"][0]["maximum"] == limits.MAX_TOKENS
    assert p["budget"]["properties"]["kv_bytes"]["maximum"] == limits.MAX_BYTES


# --- 4. bundles that lie ------------------------------------------------------------------
def _verify_fails(path: Path, expect: str):
    r = cli("verify", path)
    assert r.exit_code == 1, r.output
    assert expect in r.stdout, r.stdout


def test_a_session_renamed_at_one_level_fails_verify(tmp_path, good_bundle):
    from meshbench.analysis.figures import token_digest

    def rename(d):
        lv = d["levels"][1]
        s = lv["sessions"][0]
        s["session_id"] = "s9"
        s["tokens"] = [t + 1 for t in s["tokens"]]
        s["digest"] = token_digest(s["tokens"])
        for t in lv["tick_records"]:
            for k in ("decode_sessions", "prefill_sessions", "completed"):
                t[k] = ["s9" if x == "s0" else x for x in t[k]]

    b = tamper(copy_bundle(good_bundle, tmp_path / "b"), rename)
    _verify_fails(b, "levels[1].sessions ids not in the workload expected=[] found=['s9']")
    _verify_fails(b, "levels[1].sessions ids (same as levels[0])")


@pytest.mark.parametrize("margin", [10, 0.0])
def test_the_saturation_margin_is_meshbench_s_not_the_bundle_s(tmp_path, good_bundle, margin):
    def edit(d):
        d["saturation_margin"] = margin
        d["saturation_concurrency"] = 1

    b = tamper(copy_bundle(good_bundle, tmp_path / "b"), edit)
    _verify_fails(b, f"saturation_margin expected=0.05 found={margin}")
    _verify_fails(b, "saturation_concurrency expected=2 found=1")


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_verify_parses_json_strictly(tmp_path, good_bundle, constant):
    b = copy_bundle(good_bundle, tmp_path / "b")
    text = (b / "results.json").read_text().replace('"saturation_margin": 0.05', f'"saturation_margin": {constant}')
    (b / "results.json").write_text(text)
    run_refused("verify", b, expect=f"not valid JSON: {constant} is not JSON")


def test_non_finite_logits_fail_the_session_and_the_sweep():
    cfg, w = f.weights()
    bad = w.named_tensors()[-1][1]  # the output projection: every logit becomes NaN
    saved = bad.copy()
    bad[0, 0] = np.nan
    try:
        sweep = run_concurrency_sweep(
            SweepPlan([1, 2], Workload.uniform(2, 4, 3), f.budget()), lambda b: SyntheticEngine(cfg, w, b.kv_bytes)
        )
    finally:
        bad[:] = saved
    sessions = [s for lv in serial.to_json(sweep.levels) for s in lv["sessions"]]
    assert {s["done_reason"] for s in sessions} == {DoneReason.FAILED.value}
    assert all("EngineFault: non-finite logits" in s["error"] for s in sessions), sessions[0]["error"]
    assert not sweep.corruption_free


def test_a_model_with_non_finite_weights_is_refused_at_load(tmp_path):
    gguf = pytest.importorskip("gguf")
    from meshbench.model import gguf_io

    cfg, w = f.weights()
    for qtype in ("f32", "q8_0"):
        p = tmp_path / f"nan-{qtype}.gguf"
        gguf_io.write(p, cfg, w, qtype)
        reader = gguf.GGUFReader(p, "r+")
        t = next(t for t in reader.tensors if t.name == "blk.1.attn_q.weight")
        raw = t.data.view(np.uint8).reshape(-1)
        # F32: one value becomes +Inf; Q8_0: the first block's float16 scale becomes NaN.
        raw[:4] = (
            np.frombuffer(np.float32(np.inf).tobytes(), np.uint8)
            if qtype == "f32"
            else np.frombuffer(np.float16(np.nan).tobytes() + b"\0\0", np.uint8)
        )
        del reader, t, raw  # flush the writable memmap
        run_refused("sweep", "--model", p, expect="tensor blk.1.attn_q.weight holds 1 non-finite values")


# --- 5. YAML alias bombs, duplicate keys, floats, huge lists --------------------------------
BOMB = (
    "a: &a [x, x, x, x, x, x, x, x, x]\n"
    + "".join(
        f"{c}: &{c} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]\n" for p, c in zip("abcdefgh", "bcdefghi")
    )
    + "title: *i\n"
)

HOSTILE_CONFIGS = {
    "alias-bomb": (BOMB, "aliases (*a) are not allowed"),
    "alias-under-levels": ("x: &l [1, 2]\nlevels: *l\n", "aliases (*l) are not allowed"),
    "duplicate-key": ("levels: [1]\nlevels: [1, 2]\n", "key 'levels' appears twice"),
    "duplicate-nested-key": ("budget: {kv_bytes: 1, kv_bytes: 2}\n", "key 'kv_bytes' appears twice"),
    "float-prompt": ("workload: {prompt_tokens: 4.0}\n", "workload.prompt_tokens: 4.0 is not valid"),
    "float-sessions": ("workload: {sessions: 8.0}\n", "workload.sessions: 8.0 is not of type 'integer'"),
    "float-seed": ("engine: {seed: 1.0}\n", "engine.seed: 1.0 is not of type 'integer'"),
    "float-in-list": ("workload: {new_tokens: [8.0, 8, 8, 8, 8, 8, 8, 8]}\n", "workload.new_tokens: [8.0"),
    "float-level": ("levels: [1.0]\n", "levels.0: 1.0 is not of type 'integer'"),
    "huge-sessions": ("workload: {sessions: 1000000}\n", "workload.sessions: 1000000 is greater than the maximum"),
    "too-many-levels": ("levels: [" + ",".join(map(str, range(1, 70))) + "]\n", "levels: [1, 2, 3"),
    "deep-nesting": ("title: " + "[" * 5000 + "]" * 5000 + "\n", "nested too deeply"),
}


@pytest.mark.parametrize("name", sorted(HOSTILE_CONFIGS))
def test_hostile_configs_are_refused_quickly(tmp_path, name):
    text, expect = HOSTILE_CONFIGS[name]
    cfg = tmp_path / "c.yaml"
    cfg.write_text(text)
    t0 = time.monotonic()
    run_refused("sweep", "--config", cfg, "--out", tmp_path / "b", expect=expect, cwd_files=tmp_path)
    run_refused("admit", "--config", cfg, expect=expect)
    assert time.monotonic() - t0 < 30  # a bomb expands to 9**9 strings; refused before that


def test_huge_configs_are_refused_in_one_short_line(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("workload: {new_tokens: [" + ",".join(["8"] * 100_001) + "]}\n")
    line = run_refused("sweep", "--config", cfg, expect="workload.new_tokens: [8, 8, 8, 8, ...] is not valid")
    assert len(line) < 400
    cfg.write_text("title: " + "x" * (1 << 20) + "\n")
    run_refused("sweep", "--config", cfg, expect="is more than the 1048576 this file may hold")


def test_huge_flags_are_refused(tmp_path):
    run_refused("admit", "--burst", "100000000", expect="'--burst': Input should be less than or equal to 100000")
    run_refused("bench", "engine", "--batches", "100000000", expect="--batches: 100000000 is above the maximum 512")
    run_refused("bench", "layouts", "--batches", "100000", expect="--batches: 100000 is above the maximum 512")
    run_refused("sweep", "--sessions", "1000000", expect="'--sessions': Input should be less than or equal to 100000")


# --- 6. SIGTERM cleans up like Ctrl-C -----------------------------------------------------
def _wait_for(p: subprocess.Popen, text: bytes, timeout: float = 120.0) -> bytes:
    """Read stderr until ``text`` appears: the process is surely past start-up."""
    seen = b""
    deadline = time.monotonic() + timeout
    while text not in seen:
        assert time.monotonic() < deadline and p.poll() is None, seen
        ready, _, _ = select.select([p.stderr], [], [], 0.5)
        if ready:
            seen += os.read(p.stderr.fileno(), 4096)
    return seen


def _default_sigint():
    # A test run started from a shell's background job inherits SIGINT as ignored: undo that.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize("isolate", ["--no-isolate", "--isolate"])
@pytest.mark.parametrize("sig,code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_to_a_running_sweep_leaves_nothing(tmp_path, sig, code, isolate):
    out = tmp_path / "b"
    cmd = [
        *CLI,
        "sweep",
        "--preset",
        "bench",
        "--sessions",
        "8",
        "--prompt-tokens",
        "64",
        "--new-tokens",
        "64",
        isolate,
        "--out",
        str(out),
    ]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=_default_sigint)
    try:
        seen = _wait_for(p, b"sweep: level 1 started")  # the sweep is running
        children = _children_of(p.pid)  # with --isolate: the engine's process
        p.send_signal(sig)
        _, rest = p.communicate(timeout=120)
        stderr = (seen + rest).decode()
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == code, stderr
    assert "Traceback" not in stderr
    assert list(tmp_path.iterdir()) == []  # no bundle, no staging folder
    assert len(children) == (1 if isolate == "--isolate" else 0), children
    assert not [c for c in children if Path(f"/proc/{c}").exists()]  # the engine's process went with the sweep


def _children_of(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = entry.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            found.append(int(entry.parent.name))
    return found


def test_sigterm_while_the_bundle_is_written_keeps_the_old_bundle(tmp_path, good_bundle, monkeypatch):
    b = copy_bundle(good_bundle, tmp_path / "b")
    before = tree(b)

    def killed(data, path):
        os.kill(os.getpid(), signal.SIGTERM)  # arrives while the staging folder is being filled
        return False

    monkeypatch.setattr(chart, "write", killed)
    r = cli("sweep", "--levels", "1,2", "--out", b, "--force")
    assert r.exit_code == 143, r.output
    assert "terminated" in r.stderr
    assert tree(b) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b"]


# --- 7. verify reports every bundle --------------------------------------------------------
def test_verify_reports_every_bundle_and_exits_with_the_worst(tmp_path, good_bundle):
    a = copy_bundle(good_bundle, tmp_path / "a")
    c = copy_bundle(good_bundle, tmp_path / "c")
    deep = tmp_path / "deep"
    deep.mkdir()
    (deep / "results.json").write_text("[" * 100_000 + "]" * 100_000)
    r = cli("verify", a, deep, c)
    assert r.exit_code == 2, r.output
    assert f"{a}: ok" in r.stdout and f"{c}: ok" in r.stdout
    assert "nested too deeply" in r.stderr


def test_verify_rerun_refuses_a_config_echo_that_is_not_a_config(tmp_path, good_bundle):
    def empty(d):
        d["config"] = {}

    def unknown(d):
        d["config"]["engine"]["kind2"] = "x"

    a = tamper(copy_bundle(good_bundle, tmp_path / "a"), empty)
    b = tamper(copy_bundle(good_bundle, tmp_path / "b"), unknown)
    run_refused("verify", a, "--rerun", expect="config: 'story' is missing")
    run_refused("verify", b, "--rerun", expect="config.engine: unknown key ('kind2' was unexpected)")


def test_verify_refuses_a_readme_that_is_not_utf8(tmp_path, good_bundle):
    b = copy_bundle(good_bundle, tmp_path / "b")
    (b / "README.md").write_bytes(b"\xff\xfe not utf-8")
    run_refused("verify", b, expect="README " + str(b / "README.md") + ": not UTF-8 text")


# --- --out destinations, checked before running, by really trying -------------------------
def test_out_destinations_that_cannot_be_a_bundle(tmp_path):
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "nowhere")
    real = tmp_path / "real"
    real.mkdir()
    link = tmp_path / "link"
    link.symlink_to(real)
    cases = {
        ".": "name the bundle folder",
        "": "name the bundle folder",
        "..": "name the bundle folder",
        str(dangling): "is a symbolic link",
        str(link): "is a symbolic link",
        "/proc": "is a mount point",
        "/proc/x": "cannot create a folder there",
        str(tmp_path / ("x" * 300)): "cannot create a folder there (File name too long)",
    }
    for out, expect in cases.items():
        t0 = time.monotonic()
        run_refused("sweep", "--preset", "bench", "--out", out, expect=expect)
        assert time.monotonic() - t0 < 10, f"{out}: refused only after running"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dangling", "link", "real"]
    assert list(real.iterdir()) == []


def test_bundles_respect_the_umask(tmp_path):
    old = os.umask(0o022)
    try:
        assert cli("sweep", "--levels", "1", "--out", tmp_path / "b").exit_code == 0
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "b").stat().st_mode) == 0o755
    assert stat.S_IMODE((tmp_path / "b" / "results.json").stat().st_mode) == 0o644


# --- full disks and closed outputs ----------------------------------------------------------
def _shell(cmd: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", "-c", cmd],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHON": sys.executable},
    )


def test_output_that_cannot_be_written_is_an_error(tmp_path, good_bundle):
    py = '"$PYTHON" -m meshbench.cli'
    cases = {
        f"{py} sweep --levels 1 --json > /dev/full": "No space left on device",
        f"{py} verify {good_bundle} > /dev/full": "No space left on device",
        f"{py} sweep --levels 1 --json >&-": "standard output is closed",
        f"ulimit -f 10; {py} sweep --levels 1 --json > x.json": "File too large",
        f"ulimit -f 50; {py} sweep --out b": "cannot write the bundle (File too large)",
    }
    for cmd, expect in cases.items():
        r = _shell(cmd, tmp_path)
        assert r.returncode == 2, (cmd, r.returncode, r.stderr)
        assert "Traceback" not in r.stderr and expect in r.stderr, (cmd, r.stderr)
    assert not (tmp_path / "b").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".meshbench")]


# --- FIFOs and other files that are not regular ----------------------------------------------
def test_fifos_are_refused_not_waited_on(tmp_path, good_bundle):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    b = copy_bundle(good_bundle, tmp_path / "b")
    (b / "results.json").unlink()
    os.mkfifo(b / "results.json")
    rerun = copy_bundle(good_bundle, tmp_path / "rerun")

    def model_is_the_fifo(d):
        d["config"]["engine"]["model"] = str(fifo)

    tamper(rerun, model_is_the_fifo)
    cases = [
        (["sweep", "--model", fifo], "model"),
        (["sweep", "--engine", "gguf", "--model", fifo], "model"),
        (["verify", rerun, "--rerun"], "model"),
        (["sweep", "--config", fifo], "config"),
        (["admit", "--model", fifo], "model"),
        (["bench", "gguf", "--model", fifo], "model"),
        (["verify", b], "results"),
    ]
    for args, what in cases:
        r = subprocess.run([*CLI, *map(str, args)], capture_output=True, text=True, timeout=120)
        assert r.returncode == 2, (args, r.stderr)
        assert f"{what} " in r.stderr and "is not a regular file (a FIFO)" in r.stderr, r.stderr


# --- a sweep whose evidence would fail verify exits non-zero ---------------------------------
def test_a_sweep_with_failed_sessions_exits_1_and_says_why(tmp_path, monkeypatch):
    def broken(self, items):
        raise RuntimeError("decode fault")

    monkeypatch.setattr(SyntheticEngine, "decode_batch", broken)
    r = cli("sweep", "--levels", "1", "--out", tmp_path / "b")
    assert r.exit_code == 1, r.output
    assert "corruption_free=False" in r.stdout
    assert (
        "sweep: results.json: levels[0].failed (no session may fail but by an injected fault) expected=0 found=8"
    ) in r.stderr
    assert (tmp_path / "b" / "results.json").exists()  # the evidence of the failure is kept


# --- admit and sweep apply one rule ------------------------------------------------------------
def test_admit_refuses_what_sweep_refuses():
    run_refused("admit", "--new-tokens", "100000", expect="context length is 512")
    run_refused("sweep", "--new-tokens", "100000", expect="context length is 512")


# --- verify --rerun writes only into meshbench's own cache ----------------------------------------
def test_rerun_generates_models_in_the_cache_never_where_the_bundle_says(tmp_path, monkeypatch):
    pytest.importorskip("gguf")
    monkeypatch.setenv("MESHBENCH_CACHE", str(tmp_path / "cache"))
    model = tmp_path / "cfg" / "m.gguf"
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"engine: {{model: {model}, make_model: {{preset: dgr-012, type: f32}}}}\nlevels: [1, 2]\n")
    b = tmp_path / "b"
    assert cli("sweep", "--config", cfg, "--out", b).exit_code == 0
    evil = tmp_path / "evil" / "deep" / "m.gguf"

    def point_elsewhere(d):
        d["config"]["engine"]["model"] = str(evil)

    tamper(b, point_elsewhere)
    r = cli("verify", b, "--rerun")
    assert r.exit_code == 0, r.output
    assert not (tmp_path / "evil").exists()
    assert (tmp_path / "cache" / "models" / "dgr-012-f32-seed0-v2.gguf").is_file()
