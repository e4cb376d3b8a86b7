"""The edges a user meets (issue 56): a crash is one line and exit 3 with its traceback in a log file; verify and node
serve speak JSON; progress never runs past its total; verify --rerun --threads reruns on another thread count and
still holds every record."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import factories as f
import pytest
from test_isolation import Leaker
from typer.testing import CliRunner

from meshbench.cli import app, exits
from meshbench.sweep.levels import PassDone, SweepPlan, run_concurrency_sweep
from meshbench.workload.workload import Workload

runner = CliRunner()
ROOT = Path(__file__).resolve().parent.parent


def test_a_crash_is_one_line_exit_3_and_a_log_holding_the_traceback(made, monkeypatch, tmp_path):
    import meshbench.cli.verify as verify_cli

    def broken(*_a, **_k):
        raise ZeroDivisionError("a planted bug")

    monkeypatch.setenv("MESHBENCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(verify_cli, "_checked", broken)
    r = runner.invoke(app, ["verify", str(made)])
    assert r.exit_code == exits.CRASHED == 3
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("crash: ") and "ZeroDivisionError: a planted bug" in lines[0]
    logs = list((tmp_path / "cache" / "crashes").iterdir())
    assert len(logs) == 1 and str(logs[0]) in lines[0]
    assert "Traceback" in logs[0].read_text() and "a planted bug" in logs[0].read_text()
    assert "Traceback" not in r.output


def test_a_failed_check_stays_exit_1_and_bad_input_exit_2(made, tmp_path):
    bad = tmp_path / "B"
    shutil.copytree(made, bad)
    data = json.loads((bad / "results.json").read_text())
    data["levels"][0]["ticks"] += 1
    (bad / "results.json").write_text(json.dumps(data, indent=1))
    assert runner.invoke(app, ["verify", str(bad)]).exit_code == exits.CHECK_FAILED == 1
    assert runner.invoke(app, ["verify", str(tmp_path / "nothing")]).exit_code == exits.BAD_INPUT == 2


def test_help_lists_the_exit_codes():
    text = runner.invoke(app, ["--help"]).output
    for code, _ in exits.MEANINGS:
        assert f" {code} " in text, code


def test_verify_json_is_one_document_with_the_same_exit_code(made, tmp_path):
    r = runner.invoke(app, ["verify", str(made), str(tmp_path / "none"), "--json"])
    assert r.exit_code == 2
    doc = json.loads(r.stdout)
    assert doc["exit_code"] == 2 and doc["rerun"] is False
    ok, missing = doc["bundles"]
    assert ok["status"] == "ok" and ok["failed"] == 0 and ok["checks"] > 100 and ok["seconds"] >= 0
    assert missing["status"] == "error" and "no such directory" in missing["error"]


def test_a_forged_thread_count_fails_plain_verify(tmp_path):
    forged = tmp_path / "B"
    shutil.copytree(ROOT / "evidence" / "DGR-012-gguf", forged)
    data = json.loads((forged / "results.json").read_text())
    data["engine"]["threads"] = 1  # the echo says 2
    (forged / "results.json").write_text(json.dumps(data, indent=1))
    r = runner.invoke(app, ["verify", str(forged)])
    assert r.exit_code == 1 and "engine.threads (= config.engine.threads)" in r.stdout


def test_threads_without_rerun_is_refused(made):
    r = runner.invoke(app, ["verify", str(made), "--threads", "1"])
    assert r.exit_code == 2 and "--threads chooses the threads of a rerun" in r.stderr


def test_prompts_on_the_synthetic_engine_says_what_to_do(tmp_path):
    p = tmp_path / "p.txt"
    p.write_text("one\ntwo\n")
    r = runner.invoke(app, ["sweep", "--prompts", str(p), "--sessions", "2"])
    assert r.exit_code == 2
    assert "--engine gguf --model FILE" in r.stderr and "--target URL" in r.stderr


def _watched(levels, factory, rounds=2):
    seen: list[PassDone] = []
    plan = SweepPlan(list(levels), Workload.uniform(8, 4, 8), f.budget(kv_bytes=1 << 24), isolation_rounds=rounds)
    run_concurrency_sweep(plan, factory, on_pass=seen.append)
    return seen


@pytest.mark.parametrize("leak", [False, True])
def test_progress_counts_every_pass_and_never_runs_past_its_total(leak):
    factory = (lambda b: Leaker(f.engine(b.kv_bytes))) if leak else (lambda b: f.engine(b.kv_bytes))
    seen = _watched((1, 8), factory)
    for level in (1, 8):
        mine = [p for p in seen if p.level == level]
        assert [p.done for p in mine] == list(range(1, len(mine) + 1))
        assert all(p.done <= p.planned for p in mine)
        assert mine[-1].done == mine[-1].planned  # it ends at its total
        kinds = [p.kind for p in mine]
        assert kinds.count("timed") == 1 and kinds.count("isolation") == len(mine) - 1
    # the leak's confirmations were not planned: the total grew before the count reached it
    at_8 = [p for p in seen if p.level == 8]
    assert (at_8[-1].planned > at_8[0].planned) == leak


def test_verify_rerun_on_one_thread_holds_every_record_of_a_gguf_bundle():
    pytest.importorskip("llama_cpp")
    r = runner.invoke(app, ["verify", str(ROOT / "evidence" / "DGR-012-gguf"), "--rerun", "--threads", "1"])
    assert r.exit_code == 0, r.output
    assert "rerun on 1 CPU thread(s), the bundle's 2" in r.stdout


def test_node_serve_json_says_where_it_listens_and_that_it_stopped():
    import os
    import subprocess
    import sys

    pytest.importorskip("llama_cpp")
    import llama_cpp

    from meshbench.engine.process import workers

    if not llama_cpp.llama_supports_rpc():
        pytest.skip("llama-cpp-python was built without RPC")
    port = workers.free_port()
    cmd = [sys.executable, "-m", "meshbench.cli", "node", "serve", "--port", str(port), "--threads", "1", "--json"]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        first = json.loads(p.stdout.readline())
        assert first == {"event": "listening", "endpoint": f"127.0.0.1:{port}", "pid": p.pid, "threads": 1}
        os.kill(p.pid, 15)
        rest, _ = p.communicate(timeout=30)
    finally:
        workers.stop(p)
    assert p.returncode == 0 and json.loads(rest) == {"event": "stopped", "why": "SIGTERM"}
