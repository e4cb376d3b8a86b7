"""The fault matrix on llama.cpp: in the node's process, in its own process, and with its layers on two
spawned RPC workers, one of which is killed for real mid-sweep. Every process is stopped by the code
that started it; the fixture checks that none is left."""

import json

import factories as f
import pytest
from test_faults import children, ended, no_leftover_processes, reference_tokens  # noqa: F401
from test_rpc import _serving_pids
from typer.testing import CliRunner

from meshbench.cli import app

llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python is not importable: the GGUF engine is untested")
runner = CliRunner()


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return f.tiny_gguf(tmp_path_factory.mktemp("m") / "q8.gguf")


def sweep(model, *args) -> dict:
    r = runner.invoke(
        app,
        [
            "sweep",
            "--json",
            "--engine",
            "gguf",
            "--model",
            str(model),
            "--threads",
            "1",
            "--warmup",
            "0",
            *map(str, args),
        ],
    )
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def test_in_process_faults_on_llama_cpp(model):
    data = sweep(
        model,
        "--levels",
        "4",
        "--inject",
        "cancel:s1@2,cancel:s3@2,cancel:s6@2",
        "--inject",
        "evict:s0@3",
        "--inject",
        "raise:prefill@2",
        "--inject",
        "raise:decode@4",
    )
    assert data["engine"]["isolated"] is False
    cancel, evict, pre, dec = data["levels"]
    assert [ended(cancel)[(s, 1)][0] for s in ("s1", "s3", "s6")] == ["CANCELLED"] * 3
    assert ended(evict)[("s0", 1)] == ("CACHE_MISS", None)  # llama.cpp's sequence removed: the miss path
    assert ended(pre)[("s2", 1)][1] == "prefill: InjectedFault: injected into the prefill call"
    assert [k for k, (end, _) in ended(dec).items() if end == "FAILED"] == [("s0", 1), ("s1", 1), ("s2", 1), ("s3", 1)]
    assert data["corruption_free"] is True and all(lv["tick_records"][-1]["kv_bytes"] == 0 for lv in data["levels"])


def test_llama_cpp_in_its_own_process_survives_a_kill_and_an_abort(model, no_leftover_processes):  # noqa: F811
    data = sweep(
        model,
        "--levels",
        "2",
        "--isolate",
        "--restart-engine",
        "--inject",
        "kill-engine@3",
        "--inject",
        "abort-engine@5",
    )
    ref = reference_tokens(data)
    for lv, cause in zip(data["levels"], ("SIGKILL", "SIGABRT")):
        assert lv["engine_losses"][0]["cause"] == f"engine lost: {cause}"
        last = {s["session_id"]: s for s in lv["sessions"]}
        assert all(s["done_reason"] == "COMPLETED" and s["tokens"] == ref[sid] for sid, s in last.items())
    assert data["corruption_free"] is True


def test_a_killed_rpc_worker_with_restart_respawns_the_node_and_the_tokens_hold(model, no_leftover_processes):  # noqa: F811
    before = _serving_pids()
    data = sweep(model, "--levels", "2,4", "--workers", "2", "--restart-engine", "--inject", "kill-worker:1@4")
    assert data["engine"]["isolated"] is True  # the default with RPC workers
    ref = reference_tokens(data)
    for lv in data["levels"]:
        e = lv["fault_events"][0]
        assert e["hit"].startswith("between ticks, worker 1 killed")
        assert e["cause"] == "engine lost: SIGABRT"  # llama.cpp aborts its process when a worker goes away
        assert [r["epoch"] for r in e["resubmitted"]] == [2] * lv["concurrency"]
        last = {s["session_id"]: s for s in lv["sessions"]}
        assert all(s["done_reason"] == "COMPLETED" and s["tokens"] == ref[sid] for sid, s in last.items())
    assert data["corruption_free"] is True
    assert _serving_pids() == before  # the respawned workers were stopped too


def test_a_killed_rpc_worker_without_restart_fails_the_affected_sessions_only(model, no_leftover_processes):  # noqa: F811
    data = sweep(model, "--levels", "2,4", "--workers", "2", "--inject", "kill-worker:0@9")
    ref = reference_tokens(data)
    for lv in data["levels"]:  # the second level ran on a fresh node: the first one's loss did not leak
        ends = ended(lv)
        done = [sid for (sid, _), (end, _) in ends.items() if end == "COMPLETED"]
        failed = [sid for (sid, _), (end, _) in ends.items() if end == "FAILED"]
        assert done and failed and len(done) + len(failed) == 8
        assert all(s["tokens"] == ref[s["session_id"]] for s in lv["sessions"] if s["done_reason"] == "COMPLETED")
        assert lv["engine_losses"][0]["resubmitted"] == []
    assert data["corruption_free"] is True
