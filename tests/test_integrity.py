"""Evidence integrity (probe 3): every sweep's own bundle verifies, --rerun compares every deterministic
record, impossible timing and cheap invariants fail plain verify, nothing is overwritten."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import factories as f
import pytest
from typer.testing import CliRunner

from meshbench.cli import app
from meshbench.cli import compare as cli_compare
from meshbench.errors import MeshbenchError
from meshbench.results import document as results
from meshbench.results import kinds
from meshbench.sweep import run
from meshbench.verify import bundle as verify

runner = CliRunner()

ARRIVALS = ["all-at-once", "poisson:0.1234567", "gamma:0.5:1.2345678", "trace:3,0,7,1,1,2,6,5", "trace:FILE"]
FAULTS = [None, "cancel:s1@2", "evict:s0@3", "raise:prefill@2", "raise:decode@4"]


def _sweep(out: Path, *args: str) -> None:
    r = runner.invoke(app, ["sweep", "--levels", "1,2", "--out", str(out), *args])
    assert r.exit_code == 0, r.output


@pytest.mark.parametrize("fault", FAULTS)
@pytest.mark.parametrize("arrivals", ARRIVALS)
def test_every_arrival_kind_and_fault_kind_verifies_and_reruns(tmp_path, arrivals, fault):
    if arrivals == "trace:FILE":
        trace = tmp_path / "trace.txt"
        trace.write_text("4\n0\n0\n9\n1\n2\n2\n3\n")
        arrivals = f"trace:{trace}"
    out = tmp_path / "b"
    _sweep(out, "--arrivals", arrivals, *(["--inject", fault] if fault else []))
    r = runner.invoke(app, ["verify", str(out), "--rerun"])
    assert r.exit_code == 0, r.output
    data = json.loads((out / "results.json").read_text())
    for lv in data["levels"]:
        assert lv["arrivals"] == "all-at-once" or ":" in lv["arrivals"]


@pytest.fixture(scope="module")
def backpressure(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("bp") / "b"
    # (one rate above what the node serves, so the queue refuses: the rerun's admission check is what is tested)
    args = ["--levels", "2", "--rates", "2.0", "--isolation-rounds", "1", "--repeat", "1", "--warmup", "0"]
    r = runner.invoke(app, ["sweep", "--config", "configs/backpressure.yaml", *args, "--out", str(out)])
    assert r.exit_code == 0, r.output
    return out


def _forged(src: Path, dst: Path, edit) -> Path:
    """A careful forger: edit results.json, then write the README it renders (figures left as edited)."""
    data = json.loads((src / "results.json").read_text())
    edit(data)
    dst.mkdir()
    (dst / "results.json").write_text(results.dumps(data))

    name = verify.bundle_name((src / "README.md").read_text(), src)
    (dst / "README.md").write_text(kinds.readme(data, name))
    return dst


def _rerun_failures(path: Path) -> list[str]:
    c = verify.check_bundle(path, rerun=run.rerun_results)
    return [f.field for f in c.failures]


def test_rerun_compares_admission_decisions(backpressure, tmp_path):
    def relabel(data):
        for lv in data["levels"]:
            for e in lv["submit_events"]:
                if e["decision"] == "REJECTED_QUEUE_FULL":
                    e["decision"] = "REJECTED_KV_BUDGET"

    data = json.loads((backpressure / "results.json").read_text())
    assert any(e["decision"] == "REJECTED_QUEUE_FULL" for lv in data["levels"] for e in lv["submit_events"])
    bad = _rerun_failures(_forged(backpressure, tmp_path / "f", relabel))
    assert any("submit_events" in f for f in bad), bad


def test_rerun_compares_margins(tmp_path):
    out = tmp_path / "b"
    _sweep(out)

    def scale(data):
        for lv in data["levels"]:
            for s in lv["sessions"]:
                s["margins"] = [m * 0.001 for m in s["margins"]]

    bad = _rerun_failures(_forged(out, tmp_path / "f", scale))
    assert any(f.startswith("levels[0].sessions[") for f in bad), bad


TIMING_FORGERIES = {
    "stamps emptied": lambda rep: rep["sessions"][0].update(token_ns=[]),
    "stamps reversed": lambda rep: rep["sessions"][0].update(token_ns=rep["sessions"][0]["token_ns"][::-1]),
    "engine time over tick time": lambda rep: rep["tick_records"][1].update(
        decode_ns=rep["tick_records"][1]["tick_ns"] + 5
    ),
    "wall_s / 100": lambda rep: rep.update(wall_s=rep["wall_s"] / 100),
    "submit after the first token": lambda rep: rep["sessions"][1].update(
        submit_ns=rep["sessions"][1]["token_ns"][0] + 1
    ),
}


@pytest.mark.parametrize("name", sorted(TIMING_FORGERIES))
def test_impossible_timing_fails_plain_verify(tmp_path, name):
    out = tmp_path / "b"
    _sweep(out, "--repeat", "2")
    assert runner.invoke(app, ["verify", str(out)]).exit_code == 0

    def forge(data):

        lv = data["levels"][1]
        rep = lv["repetitions"][0]
        TIMING_FORGERIES[name](rep)
        f.recompute_wall(lv)

    c = verify.check_bundle(_forged(out, tmp_path / "f", forge))
    assert c.failures, name


def test_copied_repetitions_fail_plain_verify(tmp_path):
    out = tmp_path / "b"
    _sweep(out, "--repeat", "3")

    def copy(data):
        lv = data["levels"][0]
        best = lv["repetitions"][0]
        for i, rep in enumerate(lv["repetitions"]):
            lv["repetitions"][i] = dict(best, repetition=rep["repetition"], position=rep["position"])

    c = verify.check_bundle(_forged(out, tmp_path / "f", copy))
    assert any("a copy, not a run" in f.field for f in c.failures), c.failures


def test_cheap_invariants_fail_plain_verify(tmp_path):
    out = tmp_path / "b"
    _sweep(out, "--max-prefill-tokens-per-tick", "8")

    def completed_to_ended(data):
        for lv in data["levels"]:
            for t in lv["tick_records"]:
                if t["completed"]:
                    t["ended"], t["completed"] = t["completed"], []
                    return

    c = verify.check_bundle(_forged(out, tmp_path / "f1", completed_to_ended))
    assert any(".ended " in f.field for f in c.failures), c.failures

    def chunk_over_budget(data):
        for lv in data["levels"]:
            for t in lv["tick_records"]:
                if len(t["prefill_chunks"]) > 1:
                    t["prefill_chunks"][1][2] += 100
                    return
        raise AssertionError("no tick with two prefill pieces")

    c = verify.check_bundle(_forged(out, tmp_path / "f2", chunk_over_budget))
    assert any("within the budget" in f.field for f in c.failures), c.failures


def test_readme_prose_is_checked_whole(tmp_path):
    out = tmp_path / "b"
    _sweep(out)
    text = (out / "README.md").read_text()
    (out / "README.md").write_text(text.replace("batch_invariant = True", "batch_invariant = False"))
    r = runner.invoke(app, ["verify", str(out)])
    assert r.exit_code == 1 and "the README as results.json renders it" in r.output


def test_two_sweeps_to_one_out_one_wins_the_other_is_refused(tmp_path):
    out = tmp_path / "race"
    cmd = [sys.executable, "-m", "meshbench.cli", "sweep", "--levels", "1", "--out", str(out)]
    procs = [subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    codes = sorted(p.wait(timeout=300) for p in procs)
    errs = [p.stderr.read() for p in procs]
    assert codes in ([0, 2], [0, 0]), errs  # both 0 only if one finished before the other checked --out
    if codes == [0, 2]:
        assert any("nothing was replaced" in e or "exists" in e for e in errs), errs
    assert runner.invoke(app, ["verify", str(out)]).exit_code == 0
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".meshbench-")]


def test_compare_markdown_never_overwrites_or_writes_into_a_bundle(tmp_path):
    a = tmp_path / "a"
    _sweep(a)
    existing = tmp_path / "summary.md"
    existing.write_text("keep me")
    r = runner.invoke(app, ["compare", str(a), str(a), "--markdown", str(existing)])
    assert r.exit_code == 2 and "exists; pass --force" in r.stderr and existing.read_text() == "keep me"
    r = runner.invoke(app, ["compare", str(a), str(a), "--markdown", str(a / "results.json")])
    assert r.exit_code == 2
    r = runner.invoke(app, ["compare", str(a), str(a), "--markdown", str(a / "new.md")])
    assert r.exit_code == 2 and "is an evidence bundle" in r.stderr and not (a / "new.md").exists()
    assert runner.invoke(app, ["compare", str(a), str(a), "--markdown", str(existing), "--force"]).exit_code == 0
    assert existing.read_text() != "keep me"


def test_compare_compares_every_fault_row(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    _sweep(a, "--inject", "cancel:s1@2", "--inject", "raise:decode@4")
    _sweep(b, "--inject", "cancel:s1@2", "--inject", "raise:decode@5")
    r = runner.invoke(app, ["compare", str(a), str(b), "--json"])
    report = json.loads(r.stdout)
    names = [(lv["concurrency"], tuple(lv["faults"])) for lv in report["levels"]]
    assert (1, ("cancel:s1@2",)) in names and (2, ("cancel:s1@2",)) in names  # the shared row, both levels


@pytest.mark.parametrize(
    "value, fraction", [("10%", 0.10), ("10", 0.10), ("5", 0.05), ("0", 0.0), ("1000%", 10.0), (" 2.5 % ", 0.025)]
)
def test_tolerance_is_a_percentage_with_or_without_the_sign(value, fraction):
    assert cli_compare._tolerance(value) == pytest.approx(fraction)


@pytest.mark.parametrize("value", ["5%%", "1001%", "-1", "abc", "nan", "1e3"])
def test_tolerance_refusals_say_what_is_wanted(value):
    with pytest.raises(MeshbenchError, match="--tolerance"):
        cli_compare._tolerance(value)


def test_rpc_is_always_isolated():
    r = runner.invoke(app, ["sweep", "--engine", "gguf", "--model", "x.gguf", "--workers", "1", "--no-isolate"])
    assert r.exit_code == 2 and "own process" in r.stderr


def test_rerun_refuses_endpoints_a_bundle_names(tmp_path):
    out = tmp_path / "b"
    _sweep(out)
    data = json.loads((out / "results.json").read_text())
    data["config"]["engine"].update(kind="gguf", model="m.gguf", rpc="127.0.0.1:1")
    with pytest.raises(MeshbenchError, match="--trust-endpoints"):
        run.rerun_results(data)


def test_compare_names_the_workload_field_that_differs(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    _sweep(a)
    _sweep(b, "--arrivals", "poisson:0.5")
    r = runner.invoke(app, ["compare", str(a), str(b)])
    assert r.exit_code == 2 and "workload.arrivals" in r.stderr


def test_a_sweep_too_large_to_verify_is_refused_before_it_runs(tmp_path):
    r = runner.invoke(
        app,
        [
            "sweep",
            "--arrivals",
            "poisson:0.0001",
            "--levels",
            "1,2,4,8",
            "--repeat",
            "4",
            "--out",
            str(tmp_path / "big"),
        ],
    )
    assert r.exit_code == 2 and "results.json can hold" in r.stderr and not (tmp_path / "big").exists()


def test_impossible_paths_are_one_line(tmp_path):
    long = "a" * 300
    for args in (["verify", long], ["compare", long, "x"], ["model", "make-tiny", f"{tmp_path}/{long}.gguf"]):
        r = runner.invoke(app, args)
        assert r.exit_code == 2 and "Traceback" not in r.output, (args, r.output)


def test_a_trace_with_a_fraction_is_not_taken_for_a_file():
    r = runner.invoke(app, ["sweep", "--arrivals", "trace:0,1.5,2,3,4,5,6,7", "--levels", "1"])
    assert r.exit_code == 2 and "whole tick numbers" in r.stderr


def test_workers_die_with_a_killed_sweep(tmp_path):
    pytest.importorskip("llama_cpp")
    import llama_cpp

    if not llama_cpp.llama_supports_rpc():
        pytest.skip("this llama-cpp-python has no RPC backend")
    model = tmp_path / "m.gguf"
    assert runner.invoke(app, ["model", "make-tiny", str(model), "--type", "q8_0"]).exit_code == 0
    cmd = [
        sys.executable,
        "-m",
        "meshbench.cli",
        "sweep",
        "--engine",
        "gguf",
        "--model",
        str(model),
        "--workers",
        "2",
        "--sessions",
        "8",
        "--new-tokens",
        "400",
        "--levels",
        "1",
        "--out",
        str(tmp_path / "b"),
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        workers = _wait_for_children(proc.pid, "node", 2)
        os.kill(proc.pid, 9)
        proc.wait(timeout=30)
        for pid in workers:
            assert _gone(pid), f"worker {pid} outlived its killed sweep"
    finally:
        if proc.poll() is None:
            proc.kill()


def _children(pid: int) -> list[tuple[int, str]]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text()
                cmdline = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append((int(d.name), cmdline))
    return out


def _wait_for_children(pid: int, word: str, count: int) -> list[int]:
    import time

    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        found = [p for p, cmd in _children(pid) if word in cmd]
        if len(found) >= count:
            return found
        time.sleep(0.2)
    raise AssertionError("the sweep's workers never started")


def _gone(pid: int) -> bool:
    import time

    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return True
        if state == "Z":
            return True
        time.sleep(0.1)
    return False


@pytest.mark.parametrize("isolate", [[], ["--isolate"]])
def test_verbose_on_the_gguf_engine_is_not_a_traceback(tmp_path, isolate):
    pytest.importorskip("llama_cpp")
    model = tmp_path / "m.gguf"
    assert runner.invoke(app, ["model", "make-tiny", str(model), "--type", "q8_0"]).exit_code == 0
    cmd = [
        sys.executable,
        "-m",
        "meshbench.cli",
        "sweep",
        "--engine",
        "gguf",
        "--model",
        str(model),
        "--levels",
        "1,2",
        "--verbose",
        *isolate,
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-2000:]


def test_bench_gguf_refuses_workers_with_rpc(tmp_path):
    r = runner.invoke(
        app, ["bench", "gguf", "--model", str(tmp_path / "m.gguf"), "--workers", "0,1", "--rpc", "127.0.0.1:5"]
    )
    assert r.exit_code == 2 and "give --workers or --rpc, not both" in r.stderr


def test_slo_nan_says_it_is_not_finite():
    r = runner.invoke(app, ["sweep", "--slo-ttft", "nan"])
    assert r.exit_code == 2 and "not a finite number" in r.stderr


def test_a_relative_prompts_file_is_found_from_the_bundle_upwards(tmp_path, monkeypatch):
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "p.txt").write_text("hello\n")
    bundle = tmp_path / "evidence" / "B"
    bundle.mkdir(parents=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert run.locate("configs/p.txt", bundle) == str(tmp_path / "configs" / "p.txt")
    assert run.locate("configs/missing.txt", bundle) == "configs/missing.txt"  # then refused where it is read


def test_a_fault_event_moved_after_its_sessions_end_fails_plain_verify(tmp_path):
    out = tmp_path / "b"
    _sweep(out, "--inject", "cancel:s1@2")

    def late(data):
        for lv in data["levels"]:
            for e in lv["fault_events"]:
                if e["sessions"]:
                    e["tick"] = e["sessions"][0]["end_tick"] + 3

    c = verify.check_bundle(_forged(out, tmp_path / "f", late))
    assert any("fired (tick" in f.field for f in c.failures), c.failures


def test_a_changed_prompts_file_is_named_on_rerun_not_blamed_on_the_bundle(tmp_path):
    prompts = tmp_path / "p.txt"
    prompts.write_text("a\\nb\\n")
    from meshbench.records.context import InputFile

    inputs = {"workload.prompts": InputFile(sha256="0" * 64)}
    cfg = type("C", (), {"workload": type("W", (), {"prompts": str(prompts)})()})()
    with pytest.raises(MeshbenchError, match="changed since the bundle was made"):
        run._check_inputs(inputs, cfg)


def test_node_serve_says_listening_only_once_bound_and_resolves_localhost():
    import llama_cpp

    if not llama_cpp.llama_supports_rpc():
        pytest.skip("this llama-cpp-python has no RPC backend")
    from meshbench.engine.process.workers import free_port

    port = free_port()
    p = subprocess.Popen(
        [sys.executable, "-m", "meshbench.cli", "node", "serve", "--host", "localhost", "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = ""
        while "listening" not in line:
            line = p.stderr.readline()
            assert line, "node serve ended without listening"
        assert line.strip() == f"listening on 127.0.0.1:{port}"
        import socket

        socket.create_connection(("127.0.0.1", port), timeout=5).close()  # it really is
    finally:
        p.terminate()
        p.wait(timeout=30)


def test_a_session_moved_in_the_queue_fails_plain_verify(tmp_path):
    """`admitted` moved to a tick before the session was queued or after it was prefilled (a queue wait of -3
    ticks, say) is caught without a rerun."""
    out = tmp_path / "b"
    _sweep(out)

    def move(data):
        lv = data["levels"][0]  # concurrency 1: every session but the first waits in the queue
        t = next(t for t in lv["tick_records"] if t["admitted"])
        sid = t["admitted"].pop()
        lv["tick_records"][-1]["admitted"].append(sid)  # taken from the queue long after its prefill

    c = verify.check_bundle(_forged(out, tmp_path / "f", move))
    assert any(".admitted " in f.field for f in c.failures), c.failures
